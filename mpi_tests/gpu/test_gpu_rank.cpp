// Ranks and GPUs (dist/gpu/ccl/rank_gpu) and a mesh's NCCL communicators (dist/gpu/ccl/nccl_comm):
// the placement rule on faked counts, this node's placement against MPI's own view, and the binding
// — each rank on the GPU of its node-local index, or the same Error on every rank, before any
// NCCL call; the collectives on DeviceTensors before it, an Error saying how to bind. Runs with or
// without GPUs: the checks follow what the machine has.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/gpu/ccl/nccl_comm.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist::gpu {
namespace {

using ccl_test::bcast_string;
using testing::error_message_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

NodePlacement faked(int local_ranks, int gpus, std::string visible = {}) {
  return {
      .node = "n1",
      .rank = 3,
      .local_index = 1,
      .local_ranks = local_ranks,
      .gpus = gpus,
      .no_gpu_reason = gpus == 0 ? "cudaGetDeviceCount: no CUDA-capable device is detected" : "",
      .visible_devices = std::move(visible)};
}

TEST(GpuPlacement, NoGpuNamesTheRuntimesReason) {
  EXPECT_EQ(placement_problem(faked(2, 0)),
            "rank 3 on node n1 sees no GPU: cudaGetDeviceCount: no CUDA-capable device is "
            "detected");
  NodePlacement silent = faked(1, 0);
  silent.no_gpu_reason.clear();
  EXPECT_EQ(placement_problem(silent),
            "rank 3 on node n1 sees no GPU: the CUDA runtime reports 0 devices");
}

TEST(GpuPlacement, MoreRanksThanGpusNamesBothCounts) {
  const std::string two = placement_problem(faked(4, 2, "0,1"));
  for (const char* part : {"node n1 runs 4 ranks but rank 3 sees 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)",
                           "one rank per GPU", "run at most 2 ranks per node"}) {
    EXPECT_TRUE(contains(two, part)) << "'" << part << "' not in: " << two;
  }
  const std::string one = placement_problem(faked(2, 1));
  EXPECT_TRUE(contains(one, "runs 2 ranks but rank 3 sees 1 GPU: ")) << one;
  EXPECT_TRUE(contains(one, "at most 1 rank per node")) << one;
  EXPECT_FALSE(contains(one, "CUDA_VISIBLE_DEVICES")) << one;
}

TEST(GpuPlacement, EnoughGpusIsNoProblem) {
  EXPECT_EQ(placement_problem(faked(4, 4)), "");
  EXPECT_EQ(placement_problem(faked(1, 8)), "");
}

TEST(GpuPlacement, ThisNodeAsMpiSeesIt) {
  // The node-local index and count, from every rank's processor name.
  int me = 0, n = 0, len = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<char> names(static_cast<std::size_t>(n) * MPI_MAX_PROCESSOR_NAME);
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Get_processor_name(mine, &len);
  MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  int below = 0, same = 0;
  for (int r = 0; r < n; ++r) {
    if (std::string(&names[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]) != mine) continue;
    ++same;
    below += r < me ? 1 : 0;
  }
  const NodePlacement p = node_placement();
  EXPECT_EQ(p.node, mine);
  EXPECT_EQ(p.rank, me);
  EXPECT_EQ(p.local_index, below);
  EXPECT_EQ(p.local_ranks, same);
  EXPECT_EQ(p.gpus, meshtest::gpu::device_count());
  EXPECT_EQ(p.no_gpu_reason.empty(), p.gpus > 0) << p.no_gpu_reason;
}

// Before any binding: a mesh over part of the world cannot bind (binding is collective over
// MPI_COMM_WORLD), and says so on every device instead of hanging.
TEST(GpuBinding, AMeshOverPartOfTheWorldAsksForBindingFirst) {
  int me = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n < 2) GTEST_SKIP() << "needs 2 ranks to make a mesh of part of the world";
  ASSERT_EQ(bound_gpu(), -1) << "a test before this one bound the rank";
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half);
  {
    const MeshDevice mesh = MeshDevice::line(half);
    const std::string err = error_message_of([&] { MeshNccl::of(mesh); });
    EXPECT_TRUE(contains(err, "call dist::gpu::bind_rank_to_gpu() on every rank first")) << err;
    EXPECT_TRUE(contains(
        err, fmt::format("all {} ranks of MPI_COMM_WORLD while the mesh has {}", n, mesh.size())))
        << err;
    EXPECT_EQ(err, bcast_string(err, half)) << "messages differ within the mesh";
  }
  MPI_Comm_free(&half);
  EXPECT_EQ(bound_gpu(), -1);
}

// Before any binding: the collectives on DeviceTensors say how to bind, the same on every device
// of the group, before any CUDA or NCCL call (a tensor of no elements needs no GPU).
TEST(GpuBinding, CollectivesOnAnUnboundRankSayHowToBind) {
  ASSERT_EQ(bound_gpu(), -1) << "a test before this one bound the rank";
  const MeshDevice mesh = MeshDevice::line();
  const DeviceTensor none;
  const std::string how =
      "device 0 (axis index 0): this rank is not bound to a GPU: call "
      "dist::gpu::bind_rank_to_gpu() on every rank (collective over MPI_COMM_WORLD) before the "
      "first collective on device tensors";
  ccl_test::expect_error(mesh, kAllAxes, "all_reduce", [&] { dist::all_reduce(mesh, none); },
                         {"all_reduce on axis all", how});
  ccl_test::expect_error(mesh, 1, "all_gather", [&] { dist::all_gather(mesh, none, {.axis = 1}); },
                         {"all_gather on axis 1", how});
  ccl_test::expect_error(mesh, kAllAxes, "broadcast", [&] { dist::broadcast(mesh, none); },
                         {"broadcast on axis all", how});
  EXPECT_EQ(bound_gpu(), -1);
}

TEST(GpuBinding, EveryRankAgreesOnTheProblem) {
  const std::string problem = gpu_binding_problem();
  EXPECT_EQ(problem, bcast_string(problem, MPI_COMM_WORLD)) << "ranks disagree";
  // The lowest rank whose own placement has a problem, and that problem.
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const std::string mine = placement_problem(node_placement());
  int first = mine.empty() ? 1 << 30 : me;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == 1 << 30) {
    EXPECT_EQ(problem, "");
  } else if (first == me) {
    EXPECT_EQ(problem, mine);
  }
  if (meshtest::gpu::device_count() == 0) {
    EXPECT_TRUE(contains(problem, "sees no GPU: " + meshtest::gpu::no_gpu_reason())) << problem;
  }
}

TEST(GpuBinding, EachRankTakesItsGpuOrEveryRankThrows) {
  const std::string problem = gpu_binding_problem();
  const std::string err = error_message_of([] { bind_rank_to_gpu(); });
  if (!problem.empty()) {
    EXPECT_EQ(err, "cannot bind ranks to GPUs: " + problem);
    EXPECT_EQ(bound_gpu(), -1);
    // The mesh's communicators need the binding: the same Error again, before any NCCL call.
    const MeshDevice mesh = MeshDevice::line();
    EXPECT_EQ(error_message_of([&] { MeshNccl::of(mesh); }), err);
    return;
  }
  ASSERT_EQ(err, "");
  const int gpu = node_placement().local_index;
  EXPECT_EQ(bound_gpu(), gpu);
  EXPECT_EQ(meshtest::gpu::current_device(), gpu);
  EXPECT_EQ(bind_rank_to_gpu(), gpu) << "a second call returns the same GPU";
}

TEST(GpuPeerAccess, AgreedOnEveryRankAfterTheBindingsProblem) {
  // MESHTEST_REQUIRE_PEER_ACCESS's question: the same answer on every rank; the binding's
  // problem where there is one; else none, or the first pair of a node's GPUs that cannot reach
  // each other; none on one rank (no peer to reach).
  const std::string problem = gpu_peer_access_problem();
  EXPECT_EQ(problem, bcast_string(problem, MPI_COMM_WORLD)) << "ranks disagree";
  const std::string binding = gpu_binding_problem();
  if (!binding.empty()) {
    EXPECT_EQ(problem, binding);
  } else if (testing::world_size() == 1) {
    EXPECT_EQ(problem, "");
  } else if (!problem.empty()) {
    EXPECT_TRUE(contains(problem, "cannot access GPU")) << problem;
  }
}

}  // namespace
}  // namespace meshtest::dist::gpu
