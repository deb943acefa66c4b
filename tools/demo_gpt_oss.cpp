// meshtest-demo section: a tiny gpt-oss decoder layer on the mesh (TP on axis 1, tokens on
// axis 0) against a single-device run — PCC and the error model of the same sums in another
// order (src/check/tolerance.hpp), then its aggregated per-op perf table, e2e time and
// reports/demo/ (tools/demo_perf.hpp).
#include <fmt/format.h>
#include <mpi.h>

#include <cstdint>

#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/tensor_parallel.hpp"
#include "src/check/gpt_oss_chains.hpp"
#include "src/check/metrics.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/transformer_block.hpp"
#include "tools/demo_perf.hpp"
#include "tools/demo_sections.hpp"

namespace meshtest::dist {

int demo_gpt_oss(const MeshDevice& mesh) {
  constexpr std::int64_t kTokens = 32;
  const bool root = mesh.device_id() == 0;
  const GptOssConfig c = GptOssConfig::tiny_tp();
  const TpOptions o{.tp_axis = 1};
  const int tp = mesh.axis_size(o.tp_axis);
  if (root) {
    fmt::print(
        "\ngpt-oss decoder layer (hidden {}, {} q / {} kv heads of {}, {} experts top-{}, "
        "intermediate {}, window {}), T = {} tokens, f32, random weights: TP = {} on axis 1, "
        "tokens split over {} on axis 0, against one device\n",
        c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.num_experts,
        c.experts_per_token, c.intermediate_size, c.sliding_window, kTokens, tp, mesh.axis_size(0));
  }
  if (c.num_key_value_heads % tp != 0 || c.intermediate_size % tp != 0) {
    if (root)
      fmt::print(
          "skipped (no perf table, no reports): TP = {} does not divide the heads and "
          "intermediate\n",
          tp);
    return 0;
  }
  const BlockWeights full = init_block_weights(c, 0, DType::f32, RandomInit{42});
  const BlockWeights shard = shard_block_weights(weight_source(full, 0), c, 0, tp_rank(mesh, o));
  const Tensor x = random_normal(Shape{kTokens, c.hidden_size}, DType::f32, {.seed = 43});
  const Placements act = tp_activation_placements(o);
  const Tensor local = distribute(x, mesh, act);

  const Tensor got = gather_full(tp_transformer_block(mesh, local, shard, c, 0, o), mesh, act);
  int failed = 0;
  if (root) {
    const ErrorModel model = block_chain(c, kTokens, tp).model(DType::f32);
    const Tensor want = transformer_block(x, full, c, 0);
    const double value = pcc(want, got);
    const Comparison err = compare(want, got, model);  // S = max |want|: zero-mean random inputs
    failed = value >= 0.99999 && err.passed ? 0 : 1;
    fmt::print(
        "transformer block, mesh {}: PCC {:.9f} (threshold 0.99999), error / bound {:.3g} (<= 1, "
        "{}) {}\n",
        mesh.str(), value, err.value, model.str(), failed == 0 ? "PASS" : "FAIL");
  }
  MESHTEST_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, mesh.comm()));
  profile_section(mesh, "demo", [&] { tp_transformer_block(mesh, local, shard, c, 0, o); });
  return failed;
}

}  // namespace meshtest::dist
