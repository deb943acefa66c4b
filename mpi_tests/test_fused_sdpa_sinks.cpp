// test_fused_sdpa_sinks: the flash-style sdpa_sinks against the attention block's sdpa, in its
// TP form (each device's kv heads and their q heads and sinks: no CCL), over the fused-op kit's
// grid (dist/testing/fused/fused_op.hpp), with the gpt-oss module's config, dtype and layer
// (an even layer: the sliding window applies). The case: mpi_tests/support/fused_sdpa_sinks.hpp.
#include "mpi_tests/support/fused_sdpa_sinks.hpp"
#include "src/ops/sdpa_sinks.hpp"

namespace meshtest::dist::fused_test {
namespace {

std::vector<Tensor> sdpa_sinks_fused(const FusedSetup& s, const MeshDevice&,
                                     const std::vector<Tensor>& local) {
  return testing::fused_outputs(
      sdpa_sinks(local[0], local[1], local[2], local[3], sdpa_sinks_options(s)));
}

}  // namespace

/// The case on the default mesh (1 x N, or MESHTEST_FUSED_MESH).
static testing::FusedOpCase cpu_case() { return sdpa_sinks_case("sdpa_sinks", sdpa_sinks_fused); }

MESHTEST_FUSED_OP_TESTS(sdpa_sinks, cpu_case());
// The same case fixed on the seed's 4x8 mesh (on_seed_mesh).
MESHTEST_FUSED_OP_TESTS(sdpa_sinks_on_4x8, on_seed_mesh(cpu_case()));

}  // namespace meshtest::dist::fused_test
