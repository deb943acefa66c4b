// moe: the MLP block over its steps (steps.hpp) or the fused experts op.
#include "src/ops/moe/moe.hpp"

#include "src/ops/compute.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/moe/experts.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

void check_mlp(const MlpWeights& w, const MoeParams& p, std::int64_t hidden, DType dtype) {
  constexpr std::string_view op = "mlp_block";
  check_moe_weights(op, w.gate_weight, w.gate_bias, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight,
                    w.mlp2_bias, p, hidden, dtype);
  detail::check_shape(op, "norm.scale", w.norm_scale, Shape{hidden});
  MESHTEST_CHECK(is_floating(w.norm_scale.dtype()),
                 "mlp_block: norm.scale has dtype {}, expected f32, f64, bf16 or f16",
                 w.norm_scale.dtype());
}

Tensor mlp_block(const Tensor& x, const MlpWeights& w, const MoeParams& p) {
  perf::OpScope scope("mlp_block");
  detail::check_rank("mlp_block", "x ([T, hidden])", x, 2);
  check_mlp(w, p, x.shape()[1], x.dtype());
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  if (p.fused) {
    return add(x, experts(t, w.gate_weight, w.gate_bias, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight,
                          w.mlp2_bias, p));
  }
  const Routing r = route_top_k(linear(t, w.gate_weight, w.gate_bias), p.experts_per_token);
  const Tensor y = moe_experts(t, r, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight, p);
  return add(x, moe_combine(y, r, w.mlp2_bias));
}

}  // namespace meshtest
