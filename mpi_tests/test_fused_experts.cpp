// test_fused_experts: the fused experts op in its TP form (tp_experts: each device's
// intermediate units of every expert, the partial outputs summed by one all_reduce) against the
// MLP block's sequence after the norm (experts_reference: linear gate, route_top_k,
// moe_experts, moe_combine) on the full inputs, over the fused-op kit's grid
// (dist/testing/fused/fused_op.hpp), with the gpt-oss module's config, dtype and layer
// (mpi_tests/support/fused_experts.hpp). The op holds a CCL, so its single-device test skips
// (the kit's "contains a CCL" message).
#include <vector>

#include "dist/parallel/experts_tp.hpp"
#include "mpi_tests/support/fused_experts.hpp"

namespace meshtest::dist::fused_test {
namespace {

std::vector<Tensor> experts_fused(const FusedSetup& s, const MeshDevice& mesh,
                                  const std::vector<Tensor>& local) {
  // By reference: the kit's trace mode needs the step to read the tensors it passed in.
  const ExpertWeightRefs w{local[1], local[2], local[3], local[4], local[5], local[6]};
  return testing::fused_outputs(tp_experts(mesh, local[0], w, config(s).moe_params()));
}

}  // namespace

MESHTEST_FUSED_OP_TESTS(experts, experts_case("experts", experts_fused));

}  // namespace meshtest::dist::fused_test
