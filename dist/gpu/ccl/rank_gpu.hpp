// rank_gpu: each rank takes the GPU of its index among the ranks of its node; a node with more
// ranks than GPUs, or a rank without a GPU, is an Error on every rank before NCCL is called.
#pragma once

#include <string>

namespace meshtest::dist::gpu {

/// Where a rank stands among the ranks and the GPUs of its node.
struct NodePlacement {
  std::string node;             ///< the node's name (MPI_Get_processor_name)
  int rank = 0;                 ///< the rank in MPI_COMM_WORLD
  int local_index = 0;          ///< its index among the ranks of its node: the GPU it takes
  int local_ranks = 1;          ///< ranks on the node
  int gpus = 0;                 ///< GPUs the rank sees (after CUDA_VISIBLE_DEVICES)
  std::string no_gpu_reason;    ///< why gpus is 0 (the CUDA runtime's error)
  std::string visible_devices;  ///< CUDA_VISIBLE_DEVICES, or empty when it is not set
};

/// What keeps a rank placed as `p` from taking GPU p.local_index, or "" when nothing does:
/// no GPU at all ("rank 3 on node n1 sees no GPU: <reason>"), or more ranks on the node than
/// GPUs, naming both counts ("node n1 runs 4 ranks but rank 3 sees 2 GPUs ..."). Local.
std::string placement_problem(const NodePlacement& p);

/// This rank's placement. Collective over MPI_COMM_WORLD on the first call
/// (MPI_Comm_split_type MPI_COMM_TYPE_SHARED), local afterwards.
NodePlacement node_placement();

/// Collective over MPI_COMM_WORLD: "" when every rank can take its GPU; else, on every rank,
/// the same message: the problem of the lowest rank that has one.
std::string gpu_binding_problem();

/// Collective over MPI_COMM_WORLD the first time (and after a failed call): makes GPU
/// node_placement().local_index the calling thread's current device and returns its ordinal;
/// later calls return it at once. When any rank cannot take its GPU, every rank throws the
/// same meshtest::Error ("cannot bind ranks to GPUs: <gpu_binding_problem()>"), before any
/// NCCL call: one rank per GPU, since NCCL refuses two ranks on one GPU.
int bind_rank_to_gpu();

/// The ordinal bind_rank_to_gpu chose, or -1 before it succeeded.
int bound_gpu();

/// Collective over MPI_COMM_WORLD: "" when the GPU of every rank (its placement's) can access
/// the GPU of every other rank of its node directly (peer to peer); else, on every rank, the
/// same message naming the lowest rank's first pair that cannot, or the binding's problem.
std::string gpu_peer_access_problem();

}  // namespace meshtest::dist::gpu
