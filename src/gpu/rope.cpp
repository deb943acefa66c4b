// rope (GPU): the table from the host's rope_table, checks, and one rotation kernel per tensor.
#include "src/gpu/rope.hpp"

#include <string_view>

#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

DeviceTensor apply_rope(const DeviceTensor& x, const DeviceTensor& cos, const DeviceTensor& sin,
                        cudaStream_t stream) {
  constexpr std::string_view op = "gpu apply_rope";
  MESHTEST_CHECK(cos.rank() == 2 && sin.shape() == cos.shape(),
                 "{}: the table is cos {} and sin {}, expected two [T, d/2]", op, describe(cos),
                 describe(sin));
  const std::int64_t tokens = cos.shape()[0], half = cos.shape()[1];
  MESHTEST_CHECK(x.rank() >= 2 && x.shape()[0] == tokens && x.shape()[x.rank() - 1] == 2 * half,
                 "{}: x is {}, expected [T = {}, ..., head_dim = {}]", op, describe(x), tokens,
                 2 * half);
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", op, describe(x));
  check_dtype(op, "cos", cos, x.dtype());
  check_dtype(op, "sin", sin, x.dtype());
  const int device = x.empty() ? current_device() : x.device();
  check_on_device(op, "cos", cos, device);
  check_on_device(op, "sin", sin, device);
  const DeviceGuard guard(device);
  DeviceTensor y(x.shape(), x.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("apply_rope");
  scope.input(info(x)).input(info(cos)).input(info(sin));
  time_on_stream(scope, stream);  // last before the launch (see linear)
  const std::int64_t heads = tokens == 0 ? 0 : x.numel() / (tokens * 2 * half);
  MESHTEST_CUDA_CHECK(detail::launch_apply_rope(
      x.dtype() == DType::bf16 ? detail::Float::bf16 : detail::Float::f32, x.bytes(), cos.bytes(),
      sin.bytes(), y.bytes(), tokens, heads, half, stream));
  scope.output(info(y)).flops(3.0 * static_cast<double>(x.numel()));
  return y;
}

std::pair<DeviceTensor, DeviceTensor> rope(const DeviceTensor& q, const DeviceTensor& k,
                                           const RopeParams& p, cudaStream_t stream,
                                           std::int64_t position_offset) {
  MESHTEST_CHECK(q.rank() >= 1 && k.rank() >= 1 && q.shape()[0] == k.shape()[0],
                 "gpu rope: q {} and k {} must have the same number of tokens (dim 0)", describe(q),
                 describe(k));
  MESHTEST_CHECK(q.dtype() == k.dtype(), "gpu rope: q is {} but k is {}", describe(q), describe(k));
  const DeviceGuard guard(q.empty() ? current_device() : q.device());
  perf::OpScope scope("rope");
  scope.input(info(q)).input(info(k)).attr("offset", position_offset);
  const RopeTable table = rope_table(p, q.shape()[0], position_offset, q.dtype());
  const DeviceTensor cos = DeviceTensor::from_host(table.cos);
  const DeviceTensor sin = DeviceTensor::from_host(table.sin);
  std::pair<DeviceTensor, DeviceTensor> out{apply_rope(q, cos, sin, stream),
                                            apply_rope(k, cos, sin, stream)};
  // The table is freed when this returns: the rotations must have read it (a freed block waits
  // for the device anyway; this keeps the rule explicit for a stream-ordered future).
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));
  scope.output(info(out.first)).output(info(out.second));
  return out;
}

}  // namespace meshtest::gpu
