// rank_gpu: the node-local index of each rank, the check of its GPU, and the agreed binding.
#include "dist/gpu/ccl/rank_gpu.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <vector>

#include "dist/gpu/ccl/nccl_calls.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist::gpu {
namespace {

int g_bound = -1;

/// Collective over MPI_COMM_WORLD: the non-empty message of the lowest rank that has one, on
/// every rank, or "" when no rank has one.
std::string lowest_rank_message(std::string mine) {
  int n = 0;
  MESHTEST_MPI(MPI_Comm_size(MPI_COMM_WORLD, &n));
  const int len = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(n));
  MESHTEST_MPI(MPI_Allgather(&len, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD));
  const auto first = std::find_if(lengths.begin(), lengths.end(), [](int l) { return l > 0; });
  if (first == lengths.end()) return {};
  const int root = static_cast<int>(first - lengths.begin());
  mine.resize(static_cast<std::size_t>(*first));
  MESHTEST_MPI(MPI_Bcast(mine.data(), *first, MPI_CHAR, root, MPI_COMM_WORLD));
  return mine;
}

}  // namespace

std::string placement_problem(const NodePlacement& p) {
  if (p.gpus <= 0) {
    return fmt::format(
        "rank {} on node {} sees no GPU: {}", p.rank, p.node,
        p.no_gpu_reason.empty() ? "the CUDA runtime reports 0 devices" : p.no_gpu_reason);
  }
  if (p.local_ranks > p.gpus) {
    return fmt::format(
        "node {} runs {} ranks but rank {} sees {} GPU{}{}: one rank per GPU (NCCL refuses two "
        "ranks on one GPU), so run at most {} rank{} per node",
        p.node, p.local_ranks, p.rank, p.gpus, p.gpus == 1 ? "" : "s",
        p.visible_devices.empty() ? ""
                                  : fmt::format(" (CUDA_VISIBLE_DEVICES={})", p.visible_devices),
        p.gpus, p.gpus == 1 ? "" : "s");
  }
  return {};
}

NodePlacement node_placement() {
  static std::optional<NodePlacement> placed;
  if (placed) return *placed;
  NodePlacement p;
  MESHTEST_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &p.rank));
  MPI_Comm node = MPI_COMM_NULL;
  MESHTEST_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &node));
  MESHTEST_MPI(MPI_Comm_rank(node, &p.local_index));
  MESHTEST_MPI(MPI_Comm_size(node, &p.local_ranks));
  MESHTEST_MPI(MPI_Comm_free(&node));
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MESHTEST_MPI(MPI_Get_processor_name(name, &len));
  p.node.assign(name, static_cast<std::size_t>(len));
  p.gpus = meshtest::gpu::device_count();
  p.no_gpu_reason = meshtest::gpu::no_gpu_reason();
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) p.visible_devices = v;
  placed = p;
  return p;
}

std::string gpu_binding_problem() {
  return lowest_rank_message(placement_problem(node_placement()));
}

std::string gpu_peer_access_problem() {
  if (std::string problem = gpu_binding_problem(); !problem.empty()) return problem;
  const NodePlacement p = node_placement();
  std::string mine;
  for (int peer = 0; peer < p.local_ranks && mine.empty(); ++peer) {
    if (peer != p.local_index && !meshtest::gpu::can_access_peer(p.local_index, peer)) {
      mine = fmt::format("GPU {} (rank {} on node {}) cannot access GPU {}'s memory peer to peer",
                         p.local_index, p.rank, p.node, peer);
    }
  }
  return lowest_rank_message(mine);
}

int bind_rank_to_gpu() {
  if (g_bound >= 0) return g_bound;
  const NodePlacement p = node_placement();
  std::string mine = placement_problem(p);
  if (mine.empty()) {
    try {
      meshtest::gpu::set_device(p.local_index);
      MESHTEST_DIST_CUDA(cudaFree(nullptr));  // makes the context now: a broken GPU fails here
    } catch (const Error& e) {
      mine = fmt::format("rank {} on node {} cannot use GPU {}: {}", p.rank, p.node, p.local_index,
                         e.what());
    }
  }
  const std::string problem = lowest_rank_message(mine);
  if (!problem.empty()) fail("cannot bind ranks to GPUs: {}", problem);
  g_bound = p.local_index;
  return g_bound;
}

int bound_gpu() { return g_bound; }

}  // namespace meshtest::dist::gpu
