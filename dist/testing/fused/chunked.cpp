// Single-device chunked runs: device 0's chunk without its mesh, and the fixed-mesh fallback.
#include "dist/testing/fused/chunked.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <variant>

#include "dist/mesh/mpi_check.hpp"
#include "dist/testing/harness/harness.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::testing {

namespace {

void check_slot(MeshShape shape, MeshCoord coord) {
  MESHTEST_CHECK(shape[0] >= 1 && shape[1] >= 1, "mesh shape {}x{}: both dims must be >= 1",
                 shape[0], shape[1]);
  MESHTEST_CHECK(coord[0] >= 0 && coord[0] < shape[0] && coord[1] >= 0 && coord[1] < shape[1],
                 "device ({}, {}) is outside a {}x{} mesh", coord[0], coord[1], shape[0], shape[1]);
}

}  // namespace

Tensor chunk_of(const Tensor& full, const Placements& p, MeshShape shape, MeshCoord coord) {
  check_slot(shape, coord);
  const Placements valid = validate_placements(p, full.shape(), full.dtype());
  Tensor out = full;
  for (int axis = 0; axis < 2; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    if (const auto* s = std::get_if<Shard>(&valid[a])) {
      out = out.slice(s->dim, split_range(out.shape()[s->dim], shape[a], coord[a]));
    } else if (std::holds_alternative<Partial>(valid[a]) &&
               std::get<Partial>(valid[a]).op == ReduceOp::sum && coord[a] != 0) {
      out.fill(-0.0);  // the additive identity, as distribute()
    }
  }
  return out;
}

Tensor chunk_of(const MeshInput& in, MeshShape shape, MeshCoord coord) {
  if (in.shard) {
    check_slot(shape, coord);
    return in.shard(in.full, shape, coord);
  }
  return chunk_of(in.full, in.placements, shape, coord);
}

std::vector<Tensor> chunks_of(const std::vector<MeshInput>& inputs, MeshShape shape,
                              MeshCoord coord) {
  std::vector<Tensor> out;
  out.reserve(inputs.size());
  for (const MeshInput& in : inputs) out.push_back(chunk_of(in, shape, coord));
  return out;
}

MeshDevice single_device_mesh() { return MeshDevice({1, 1}, MPI_COMM_SELF); }

Comparison expect_chunk_matches(MeshShape shape, const std::vector<MeshInput>& inputs,
                                const ReferenceFn& reference, const ShardedFn& sharded,
                                const MatchOptions& options) {
  const std::vector<Tensor> chunk = chunks_of(inputs, shape, {0, 0});
  const MeshDevice one = single_device_mesh();
  const Tensor got = sharded(one, chunk);
  const Tensor expected = reference(chunk);
  const Comparison c = options.compare(expected, got);
  if (!c.passed) {
    std::string in;
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      in += fmt::format("{}{} {}", i == 0 ? "" : ", ", inputs[i].name, chunk[i].shape());
    }
    ADD_FAILURE() << "device 0's chunk of a " << shape[0] << "x" << shape[1]
                  << " mesh, run alone, differs from the reference on that chunk"
                  << (options.label.empty() ? "" : " (" + options.label + ")") << "\n  chunk " << in
                  << "\n  " << c.str();
  }
  return c;
}

MeshRun::MeshRun(MeshShape shape, const FixedMeshOptions& options) : shape_(shape) {
  check_slot(shape, {0, 0});
  const int need = shape[0] * shape[1], world = world_size(), rank = world_rank();
  if (world < need) {
    if (!options.chunk_fallback) {
      kind_ = MeshRunKind::skip;
      skip_reason_ =
          fmt::format("mesh {}x{} needs {} ranks, {} started", shape[0], shape[1], need, world);
      return;
    }
    if (rank == 0) {
      kind_ = MeshRunKind::chunk;
      mesh_.emplace(single_device_mesh());
      fmt::print(
          "[fallback] mesh {}x{} needs {} ranks, {} started: running device 0's chunk of "
          "{}x{} on one device\n",
          shape[0], shape[1], need, world, shape[0], shape[1]);
      std::fflush(stdout);
    }
    return;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  MESHTEST_MPI(MPI_Comm_split(MPI_COMM_WORLD, rank < need ? 0 : MPI_UNDEFINED, rank, &sub));
  if (sub == MPI_COMM_NULL) return;  // idle
  kind_ = MeshRunKind::mesh;
  try {
    mesh_.emplace(std::vector<int>{shape[0], shape[1]}, sub);
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MESHTEST_MPI(MPI_Comm_free(&sub));
}

const MeshDevice& MeshRun::mesh() const {
  MESHTEST_CHECK(mesh_.has_value(), "MeshRun: no mesh on this rank (kind {})",
                 kind_ == MeshRunKind::skip ? "skip" : "idle");
  return *mesh_;
}

MeshCoord MeshRun::coord() const { return chunked() ? MeshCoord{0, 0} : mesh().coord(); }

}  // namespace meshtest::dist::testing
