// expect_matches_single_device: distribute, run sharded, gather, compare with the reference.
#include "dist/testing/harness/single_device.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <variant>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::testing {

namespace {

/// The one mesh axis whose placement is Shard, or -1 (none or both).
int sharded_axis(const Placements& p) {
  const bool a0 = std::holds_alternative<Shard>(p[0]);
  const bool a1 = std::holds_alternative<Shard>(p[1]);
  return a0 == a1 ? -1 : (a0 ? 0 : 1);
}

std::string describe_inputs(const std::vector<ShardedInput>& inputs) {
  std::string s;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    s += fmt::format("{}input {}: {} {}", i == 0 ? "" : "; ", i, inputs[i].full.shape(),
                     str(inputs[i].placements));
  }
  return s;
}

}  // namespace

Comparison MatchOptions::compare(const Tensor& expected, const Tensor& got) const {
  if (model) return meshtest::compare(expected, got, *model);
  if (tolerance) return meshtest::compare(expected, got, *tolerance);
  return meshtest::compare(expected, got, metric, threshold);
}

Comparison expect_matches_single_device(const MeshDevice& mesh,
                                        const std::vector<ShardedInput>& inputs,
                                        const ReferenceFn& reference, const ShardedFn& sharded,
                                        const Placements& output, const MatchOptions& options) {
  std::vector<Tensor> local;
  local.reserve(inputs.size());
  for (const ShardedInput& in : inputs) {
    local.push_back(distribute(in.full, mesh, in.placements));
  }
  const Tensor got = gather_full(sharded(mesh, local), mesh, output);

  Comparison c;
  if (mesh.device_id() == 0) {
    std::vector<Tensor> full;
    full.reserve(inputs.size());
    for (const ShardedInput& in : inputs) {
      full.push_back(in.full);
    }
    const Tensor expected = reference(full);
    c = options.compare(expected, got);
    if (const int axis = sharded_axis(output); axis >= 0) {
      attach_owner(c, std::get<Shard>(output[static_cast<std::size_t>(axis)]).dim,
                   mesh.axis_size(axis));
    }
    if (!c.passed) {
      ADD_FAILURE() << "sharded result differs from the single-device reference"
                    << (options.label.empty() ? "" : " (" + options.label + ")") << "\n  mesh "
                    << mesh.str() << "; " << describe_inputs(inputs) << "; output " << str(output)
                    << "\n  " << c.str();
    }
  }
  // Every device returns the same verdict.
  int passed = c.passed ? 1 : 0;
  MESHTEST_MPI(MPI_Bcast(&passed, 1, MPI_INT, 0, mesh.comm()));
  MESHTEST_MPI(MPI_Bcast(&c.value, 1, MPI_DOUBLE, 0, mesh.comm()));
  c.passed = passed != 0;
  return c;
}

}  // namespace meshtest::dist::testing
