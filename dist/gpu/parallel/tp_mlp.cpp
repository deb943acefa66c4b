// tp_mlp (GPU): local checks, mlp1 and swiglu queued on the Blas's stream, then
// row_parallel_linear_after (mlp2, one agreement on every check, the all_reduce).
#include "dist/gpu/parallel/tp_mlp.hpp"

#include <cmath>
#include <string>
#include <utility>

#include "dist/mesh/agree.hpp"
#include "src/core/error.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/swiglu.hpp"

namespace meshtest::dist {

TpMlpShard shard_mlp(const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                     int size, int index) {
  MESHTEST_CHECK(w1.rank() == 2 && w1.shape()[0] % 2 == 0,
                 "shard_mlp: w1 has shape {}, expected [2I, hidden]", w1.shape());
  const std::int64_t units = w1.shape()[0] / 2, hidden = w1.shape()[1];
  MESHTEST_CHECK(size >= 1 && index >= 0 && index < size,
                 "shard_mlp: device {} of {} is not a place on the TP axis", index, size);
  MESHTEST_CHECK(units % size == 0,
                 "shard_mlp: intermediate_size = {} does not split over {} devices", units, size);
  MESHTEST_CHECK(b1.shape() == Shape{2 * units} && w2.shape() == (Shape{hidden, units}) &&
                     b2.shape() == Shape{hidden},
                 "shard_mlp: w1 {} b1 {} w2 {} b2 {} do not fit one MLP of intermediate {} and "
                 "hidden {} (w1 [2I, hidden], b1 [2I], w2 [hidden, I], b2 [hidden])",
                 w1.shape(), b1.shape(), w2.shape(), b2.shape(), units, hidden);
  const std::int64_t local = units / size, first = index * local;
  return {.w1 = DeviceTensor::from_host(w1.slice(0, 2 * first, 2 * local)),
          .b1 = DeviceTensor::from_host(b1.slice(0, 2 * first, 2 * local)),
          .w2 = DeviceTensor::from_host(w2.slice(1, first, local)),
          .b2 = DeviceTensor::from_host(b2)};
}

DeviceTensor tp_mlp(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& x,
                    const TpMlpShard& w, const TpMlpOptions& opt) {
  std::string problem = check_message("tp_mlp", [&] {
    meshtest::gpu::check_linear(blas, x, w.w1, &w.b1);
    MESHTEST_CHECK(
        w.w1.shape()[0] % 2 == 0 && w.w2.rank() == 2 && w.w2.shape()[1] == w.w1.shape()[0] / 2,
        "w1 is {} and w2 {}: expected w1 [2I_local, hidden] and w2 [hidden, I_local]",
        meshtest::gpu::describe(w.w1), meshtest::gpu::describe(w.w2));
    MESHTEST_CHECK(std::isfinite(opt.alpha) && std::isfinite(opt.limit) && opt.limit > 0,
                   "swiglu's alpha {} must be finite and limit {} finite and > 0", opt.alpha,
                   opt.limit);
  });
  // mlp1 and swiglu are queued before the devices agree (in row_parallel_linear_after, once
  // for both linears), so the GPU works while the hosts agree.
  DeviceTensor a;
  if (problem.empty()) {
    const DeviceTensor h = column_parallel_linear(blas, x, w.w1, &w.b1);
    a = meshtest::gpu::swiglu(h, blas.stream(), opt.alpha, opt.limit);
  }
  return row_parallel_linear_after(mesh, blas, a, w.w2, &w.b2, opt.tp, std::move(problem));
}

}  // namespace meshtest::dist
