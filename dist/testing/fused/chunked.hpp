// Single-device chunked runs, part of the fused-op kit (meshtest::fused_kit) and usable by any
// mesh test that links it: device 0's chunk of a mesh configuration run alone on one device,
// and tests written for a fixed mesh (say 2x4) that fall back to that chunk when started on
// fewer ranks than the mesh needs.
//
//   class Attn : public testing::FixedMeshTest {
//    protected:
//     MeshShape mesh_shape() const override { return {2, 4}; }
//     FixedMeshOptions mesh_options() const override { return {.chunk_fallback = true}; }
//   };
//   TEST_F(Attn, Matches) {
//     MESHTEST_FIXED_MESH_OR_SKIP();               // idle ranks return, a misfit skips
//     if (run().chunked()) { expect_chunk_matches(run().shape(), inputs, ref, fn); return; }
//     ... the mesh test on run().mesh() ...
//   }
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dist/mesh/mesh_device.hpp"
#include "dist/shard/placement.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "dist/testing/harness/single_device.hpp"
#include "src/check/compare.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist::testing {

/// A device's {row, col} on a mesh.
using MeshCoord = std::array<int, 2>;

/// For inputs whose per-device layout Placements cannot express (the gpt-oss qkv weight, whose
/// TP shard is the rows of one device's q, k and v heads): the piece of `full` that device
/// `coord` of a `shape` mesh holds.
using ShardFn = std::function<Tensor(const Tensor& full, MeshShape shape, MeshCoord coord)>;

/// One input of a mesh test: the whole tensor (the same on every device), its placements, and
/// a name for messages. A set `shard` decides the local piece instead of the placements.
struct MeshInput {
  std::string name = {};
  Tensor full = {};
  Placements placements = kReplicated;
  ShardFn shard = {};
};

/// The piece of `full` that device `coord` of a `shape` mesh holds under `p`, computed without
/// that mesh (so on one device for a configuration of many): axis 0 first, then axis 1; Shard
/// by the array_split rule; Replicate the whole tensor; Partial the whole tensor at axis index
/// 0 and zeros elsewhere (the canonical form of distribute()). Equals distribute(full, mesh, p)
/// on that device. Throws Error for a shape with a dim < 1, a coord outside it, or placements
/// that do not fit `full` (validate_placements).
Tensor chunk_of(const Tensor& full, const Placements& p, MeshShape shape, MeshCoord coord);
/// in.shard(in.full, shape, coord) when set, else chunk_of(in.full, in.placements, ...).
Tensor chunk_of(const MeshInput& in, MeshShape shape, MeshCoord coord);
/// chunk_of every input, in order.
std::vector<Tensor> chunks_of(const std::vector<MeshInput>& inputs, MeshShape shape,
                              MeshCoord coord);

/// A 1x1 mesh over MPI_COMM_SELF: one device, id 0. Local (no other rank takes part).
MeshDevice single_device_mesh();

/// The single-device chunked run (not collective: call it on the one rank that runs it).
/// Runs `sharded` on single_device_mesh() with device 0's chunks of `inputs` for a `shape`
/// mesh, and `reference` on the same chunks, and compares the two by `options` (the reference
/// on the chunk: a TP op's local heads are a smaller op of the same kind). On failure records
/// one gtest failure naming the label, the configuration and the comparison. A sharded op that
/// runs a CCL runs it on one device (a no-op exchange), which is not device 0's computation:
/// such tests should not ask for a chunked run (see fused_op.hpp's single_device).
Comparison expect_chunk_matches(MeshShape shape, const std::vector<MeshInput>& inputs,
                                const ReferenceFn& reference, const ShardedFn& sharded,
                                const MatchOptions& options = {});

/// How a test written for a fixed mesh runs on fewer ranks than the mesh needs.
struct FixedMeshOptions {
  /// true: rank 0 runs device 0's chunk on one device and prints a line saying so (the others
  /// idle); false: the test skips with the reason.
  bool chunk_fallback = false;
};

/// Where this rank runs a test written for a `shape` mesh (R x C):
///   mesh     world >= R*C: the mesh over ranks 0 .. R*C-1;
///   chunk    world < R*C with chunk_fallback, rank 0: a one-device mesh for device 0's chunk;
///   idle     ranks >= R*C, and ranks other than 0 of a chunk run: nothing to run (passes);
///   skip     world < R*C without chunk_fallback: skip_reason() says why.
enum class MeshRunKind { mesh, chunk, idle, skip };

/// The mesh of a test written for a fixed mesh shape (see MeshRunKind). Construction is
/// collective over MPI_COMM_WORLD (every rank passes the same shape and options); in chunk
/// runs rank 0 prints "[fallback] mesh RxC needs N ranks, W started: running device 0's chunk
/// of RxC on one device". Throws Error for a shape with a dim < 1.
class MeshRun {
 public:
  MeshRun(MeshShape shape, const FixedMeshOptions& options = {});
  MeshRunKind kind() const { return kind_; }
  bool chunked() const { return kind_ == MeshRunKind::chunk; }
  /// The configuration (R x C, also in chunk runs).
  MeshShape shape() const { return shape_; }
  /// The mesh to run on (mesh and chunk kinds; Error otherwise).
  const MeshDevice& mesh() const;
  /// This device's coordinate in the configuration ({0, 0} in chunk runs).
  MeshCoord coord() const;
  /// This device's piece of an input: chunk_of(in, shape(), coord()).
  Tensor local(const MeshInput& in) const { return chunk_of(in, shape_, coord()); }
  const std::string& skip_reason() const { return skip_reason_; }

 private:
  MeshShape shape_;
  MeshRunKind kind_ = MeshRunKind::idle;
  std::optional<MeshDevice> mesh_;
  std::string skip_reason_;
};

/// Fixture of a test written for a fixed mesh: run() is the MeshRun of mesh_shape() and
/// mesh_options(), built (collectively) in SetUp. Start the body with
/// MESHTEST_FIXED_MESH_OR_SKIP().
class FixedMeshTest : public ::testing::Test {
 protected:
  virtual MeshShape mesh_shape() const = 0;
  virtual FixedMeshOptions mesh_options() const { return {}; }
  void SetUp() override { run_.emplace(mesh_shape(), mesh_options()); }
  void TearDown() override { run_.reset(); }
  const MeshRun& run() const { return *run_; }

 private:
  std::optional<MeshRun> run_;
};

}  // namespace meshtest::dist::testing

/// In a test body over a MeshRun `r`: skips when r does not fit, returns on idle ranks.
#define MESHTEST_MESH_RUN_OR_SKIP(r)                                        \
  do {                                                                      \
    if ((r).kind() == ::meshtest::dist::testing::MeshRunKind::skip)         \
      GTEST_SKIP() << (r).skip_reason();                                    \
    if ((r).kind() == ::meshtest::dist::testing::MeshRunKind::idle) return; \
  } while (0)

/// MESHTEST_MESH_RUN_OR_SKIP(run()) in a FixedMeshTest.
#define MESHTEST_FIXED_MESH_OR_SKIP() MESHTEST_MESH_RUN_OR_SKIP(run())
