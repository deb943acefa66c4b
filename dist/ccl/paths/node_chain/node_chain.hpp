// node_chain: all_reduce over a group that spans nodes, through shared memory within each node
// and MPI between nodes, giving the bits of the one-node paths.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/ccl/options.hpp"
#include "src/core/dtype.hpp"

namespace meshtest::dist::detail {

class ShmGroup;

/// A group whose devices sit on N >= 2 nodes, q >= 2 on each, with each node holding q
/// consecutive axis indices (node k: k*q .. k*q + q - 1, as `mpirun --map-by slot` places
/// ranks). all_reduce then runs as a chain of the nodes in axis order, so that element k is
/// still x_0[k] op x_1[k] op ... op x_{p-1}[k] in axis order, accumulated unrounded and rounded
/// once (detail::reduce), the same bits as the one-node and flat MPI paths:
///  1. within node k, device i reduces part i of every chunk over the node's q inputs through
///     the node's shared-memory window (ShmGroup::reduce_parts), starting from the accumulator
///     of nodes 0..k-1 that device i of node k-1 sent it (the carry: f32 for bf16 and f16, never
///     rounded), and sends its accumulator on to device i of node k+1, chunk by chunk;
///  2. on the last node the accumulator is rounded into the result, which device i sends to
///     device i of every other node;
///  3. every node shares its devices' parts within the window (ShmGroup::gather_parts).
/// Per device and call, S the tensor's bytes: S/q (S/q·4/2 for bf16's and f16's f32 carry) leaves
/// the node and S/q comes in (the last node: (N-1)·S/q out), against about S across nodes for the
/// flat path's reduce-scatter and all-gather at 2 nodes; within the node the window moves
/// 2(q-1)/q·S. The chain's price is latency: node k starts a chunk once node k-1 has finished
/// it, so a call takes N-1 extra chunk steps, and the result comes back in one more hop.
///
/// Any other layout (ranks dealt round robin over nodes, `--map-by node`; unequal nodes; one
/// device on a node) cannot be chained in axis order and keeps the flat MPI path.
class NodeChain {
 public:
  /// Collective over `comm` the first time (every device must call it at the same point:
  /// all_reduce does after its agreement); later calls only look up the attribute. Returns
  /// the chain, or nullptr when the layout has none, the shared-memory path is off
  /// (MESHTEST_CCL_SHM=0) or a node's shared-memory group could not be made. Nodes are
  /// ShmGroup::split_node's (so tests can cut one machine into nodes).
  static NodeChain* establish(MPI_Comm comm);
  /// The chain of `comm` if establish() made one; local.
  static NodeChain* find(MPI_Comm comm);
  /// When all_reduce takes the chain of a group that has one (the environment variable
  /// MESHTEST_CCL_NODE_CHAIN, unless set_mode() overrode it): off ("0": always the flat MPI
  /// path), on ("1": whenever there is a chain) or automatic (unset or "auto": when the nodes
  /// hold kAutoPerNode devices or more each). Measured (docs/multi-node.md), the chain beats
  /// the flat path 1.1-2x from 4 devices a node on 2 nodes, and ties or loses with 2 a node,
  /// where it saves fewer bytes and still pays its latency. all_reduce agrees on the mode
  /// across the group like an option.
  enum class Mode : std::uint8_t { off, on, automatic };
  static constexpr int kAutoPerNode = 4;
  static Mode mode();
  static void set_mode(Mode m);
  /// An AgreedOption printer of a Mode value: "0", "1", "auto".
  static std::string show_mode(std::int64_t m);
  /// Whether a call of this mode takes this chain.
  bool taken(Mode m) const {
    return m == Mode::on || (m == Mode::automatic && per_node() >= kAutoPerNode);
  }

  NodeChain(const NodeChain&) = delete;
  NodeChain& operator=(const NodeChain&) = delete;
  ~NodeChain();

  int nodes() const { return nodes_; }
  int node() const { return node_; }
  int per_node() const;
  /// The most elements of t per chunk: the larger of the nodes' shared-memory step sizes
  /// (agreed), at most half a slot. A call of n elements cuts n into at least 4 chunks per
  /// node where they stay at least 16 KiB, so that the pipeline fills.
  std::int64_t chunk_elements(DType t) const;
  /// Calls that took the chain on this device since it was made.
  std::uint64_t calls() const { return calls_; }

  /// out = the reduction of every device's `in` (n elements of t) in axis order; out may be in.
  /// Collective over the group. avg sums and divides by p on the last node.
  void all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t, ReduceOp op);

 private:
  NodeChain() = default;
  MPI_Comm node_comm_ = MPI_COMM_NULL;  // this node's devices, in axis order; owns the ShmGroup
  MPI_Comm column_ = MPI_COMM_NULL;     // device i of every node, in node order
  ShmGroup* shm_ = nullptr;
  int size_ = 1;   // devices in the group (p)
  int nodes_ = 1;  // N
  int node_ = 0;   // k
  std::size_t chunk_bytes_ = 0;
  std::uint64_t calls_ = 0;
  std::vector<std::byte> carry_, partial_;  // this device's parts, end to end, accumulator type
  std::vector<MPI_Request> carries_, finals_, sends_;
};

}  // namespace meshtest::dist::detail
