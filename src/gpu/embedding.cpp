// embedding (GPU): the CPU op's checks, the ids up to the GPU, one kernel.
#include "src/gpu/embedding.hpp"

#include <string_view>

#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/ops/embedding.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

DeviceTensor embedding_shard(std::span<const std::int64_t> tokens, const DeviceTensor& shard,
                             std::int64_t first_id, std::int64_t vocab, cudaStream_t stream) {
  constexpr std::string_view op = "gpu embedding";
  MESHTEST_CHECK(shard.rank() == 2, "{}: the shard is {}, expected [rows, hidden]", op,
                 describe(shard));
  check_embedding_shard(tokens, first_id, shard.shape()[0], vocab);
  const auto n = static_cast<std::int64_t>(tokens.size());
  const DeviceGuard guard(shard.empty() ? current_device() : shard.device());
  DeviceTensor out(Shape{n, shard.shape()[1]}, shard.dtype(), Tensor::Uninitialized{});
  if (n == 0) return out;
  const DeviceTensor ids = DeviceTensor::from_host(
      Tensor::from_vector(Shape{n}, std::vector<std::int64_t>(tokens.begin(), tokens.end())));
  perf::OpScope scope("embedding");
  scope.input(info(shard)).attr("tokens", n).attr("first_id", first_id).attr("vocab", vocab);
  time_on_stream(scope, stream);
  MESHTEST_CUDA_CHECK(detail::launch_embedding_rows(
      shard.bytes(), shard.shape()[0], first_id, reinterpret_cast<const std::int64_t*>(ids.bytes()),
      n, shard.shape()[1] * static_cast<std::int64_t>(dtype_size(shard.dtype())), out.bytes(),
      stream));
  scope.output(info(out)).bytes(static_cast<std::int64_t>(out.nbytes()));
  return out;
}

}  // namespace meshtest::gpu
