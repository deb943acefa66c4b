// test_fused_qkv_rope: the fused qkv_rope against the attention block's linear + split_qkv +
// rope, in its TP form (each device's q, k and v heads: no CCL), over the fused-op kit's grid
// (dist/testing/fused/fused_op.hpp), with the gpt-oss module's config, dtype and layer
// (mpi_tests/support/fused_qkv_rope.hpp).
#include "mpi_tests/support/fused_qkv_rope.hpp"
#include "src/ops/qkv_rope.hpp"

namespace meshtest::dist::fused_test {
namespace {

std::vector<Tensor> qkv_rope_fused(const FusedSetup& s, const MeshDevice&,
                                   const std::vector<Tensor>& local) {
  const GptOssConfig c = config(s);
  const auto [heads, kv_heads] = qkv_heads(c, local[1].shape()[0]);
  Qkv qkv = qkv_rope(local[0], local[1], local[2],
                     {.num_heads = heads,
                      .num_kv_heads = kv_heads,
                      .rope = c.rope_params(),
                      .position_offset = first_position(s)});
  return testing::fused_outputs(std::move(qkv.q), std::move(qkv.k), std::move(qkv.v));
}

}  // namespace

MESHTEST_FUSED_OP_TESTS(qkv_rope, qkv_rope_case("qkv_rope", qkv_rope_fused));
// The same case fixed on the seed's 4x8 mesh (on_seed_mesh).
MESHTEST_FUSED_OP_TESTS(qkv_rope_on_4x8, on_seed_mesh(qkv_rope_case("qkv_rope", qkv_rope_fused)));

}  // namespace meshtest::dist::fused_test
