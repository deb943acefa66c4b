// experts_tp: fused experts on this device's intermediate shard, one all_reduce over the TP axis.
#include "dist/parallel/experts_tp.hpp"

#include "dist/ccl/all_reduce.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/ops/moe/experts.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {

Tensor tp_experts(const MeshDevice& mesh, const Tensor& t, const MlpWeights& w, const MoeParams& p,
                  const TpOptions& o) {
  return tp_experts(mesh, t,
                    ExpertWeightRefs{w.gate_weight, w.gate_bias, w.mlp1_weight, w.mlp1_bias,
                                     w.mlp2_weight, w.mlp2_bias},
                    p, o);
}

Tensor tp_experts(const MeshDevice& mesh, const Tensor& t, const ExpertWeightRefs& w,
                  const MoeParams& p, const TpOptions& o) {
  constexpr std::string_view op = "tp_experts";
  perf::OpScope scope(op);
  token_axis(o);
  const bool bias_here = mesh.axis_index(o.tp_axis) == 0;
  check_and_agree(mesh.comm(), op, [&] {
    MESHTEST_DIST_CHECK(t.rank() == 2, "tp_experts: t has shape {}, expected [T_local, hidden]",
                        t.shape());
    MESHTEST_DIST_CHECK(is_floating(t.dtype()),
                        "tp_experts: t has dtype {}, expected f32, f64 or bf16", t.dtype());
    check_moe_weights(op, w.gate_weight, w.gate_bias, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight,
                      w.mlp2_bias, p, t.shape()[1], t.dtype());
  });
  const Tensor no_bias;
  const Tensor& bias = bias_here ? w.mlp2_bias : no_bias;  // a reference: no copy of the bias
  Tensor partial =
      experts(t, w.gate_weight, w.gate_bias, w.mlp1_weight, w.mlp1_bias, w.mlp2_weight, bias, p);
  all_reduce_inplace(mesh, partial, {.axis = o.tp_axis});
  scope.output(partial);
  return partial;
}

}  // namespace meshtest::dist
