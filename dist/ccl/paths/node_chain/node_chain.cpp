// node_chain: all_reduce as a chain of nodes in axis order (shared memory within a node, MPI
// between nodes), with the bits of the one-node paths.
#include "dist/ccl/paths/node_chain/node_chain.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>

#include "dist/ccl/paths/shm/shm.hpp"
#include "dist/ccl/private_comm.hpp"
#include "dist/ccl/reduce.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/core/shape.hpp"

namespace meshtest::dist::detail {
namespace {

constexpr int kCarryTag = 1, kFinalTag = 2;

/// Attribute of a communicator: present once establish() ran for it; holds the chain or null.
struct EstablishedChain {
  std::unique_ptr<NodeChain> chain;
};

std::optional<NodeChain::Mode>& mode_override() {
  static std::optional<NodeChain::Mode> m;
  return m;
}

int bytes(std::int64_t elements, std::size_t size) {
  return static_cast<int>(elements * static_cast<std::int64_t>(size));  // at most a slot
}

}  // namespace

NodeChain::Mode NodeChain::mode() {
  if (mode_override()) return *mode_override();
  const char* v = std::getenv("MESHTEST_CCL_NODE_CHAIN");
  const std::string_view s = v != nullptr ? v : "";
  if (s.empty() || s == "auto") return Mode::automatic;
  if (s == "0") return Mode::off;
  if (s == "1") return Mode::on;
  dist::fail("MESHTEST_CCL_NODE_CHAIN is '{}'; expected 0 (off), 1 (on) or auto", s);
}

void NodeChain::set_mode(Mode m) { mode_override() = m; }

std::string NodeChain::show_mode(std::int64_t m) {
  switch (static_cast<Mode>(m)) {
    case Mode::off:
      return "0";
    case Mode::on:
      return "1";
    case Mode::automatic:
      break;
  }
  return "auto";
}

NodeChain* NodeChain::find(MPI_Comm comm) {
  const EstablishedChain* e = CommAttribute<EstablishedChain>::find(comm);
  return e != nullptr ? e->chain.get() : nullptr;
}

NodeChain* NodeChain::establish(MPI_Comm comm) {
  if (const EstablishedChain* e = CommAttribute<EstablishedChain>::find(comm))
    return e->chain.get();
  auto e = std::make_unique<EstablishedChain>();
  int p = 0, a = 0;
  MESHTEST_MPI(MPI_Comm_size(comm, &p));
  MESHTEST_MPI(MPI_Comm_rank(comm, &a));
  if (p >= 4) {  // at least 2 nodes of at least 2 devices
    std::unique_ptr<NodeChain> c(new NodeChain);
    c->node_comm_ = ShmGroup::split_node(comm, a);
    int q = 0, i = 0;
    MESHTEST_MPI(MPI_Comm_size(c->node_comm_, &q));
    MESHTEST_MPI(MPI_Comm_rank(c->node_comm_, &i));
    // This node's axis indices are consecutive iff its lowest and highest are q - 1 apart.
    std::array<int, 2> span{a, -a};
    MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, span.data(), 2, MPI_INT, MPI_MIN, c->node_comm_));
    const bool consecutive = -span[1] - span[0] + 1 == q && a - span[0] == i;
    // Every node consecutive, the same q >= 2 on each, and the shared-memory path on.
    std::array<int, 3> all{consecutive && ShmGroup::enabled() ? 1 : 0, q, -q};
    MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, all.data(), 3, MPI_INT, MPI_MIN, comm));
    bool ok = all[0] == 1 && all[1] == -all[2] && q >= 2 && p / q >= 2;
    if (ok) {
      ShmGroup::establish(c->node_comm_);  // collective over the node
      int made = ShmGroup::find(c->node_comm_) != nullptr ? 1 : 0;
      MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &made, 1, MPI_INT, MPI_MIN, comm));
      ok = made == 1;
    }
    if (ok) {
      c->shm_ = ShmGroup::find(c->node_comm_);
      MESHTEST_MPI(MPI_Comm_split(comm, i, a, &c->column_));
      MESHTEST_MPI(MPI_Comm_set_errhandler(c->column_, MPI_ERRORS_RETURN));
      long long chunk = static_cast<long long>(c->shm_->chunk());
      MESHTEST_MPI(MPI_Allreduce(MPI_IN_PLACE, &chunk, 1, MPI_LONG_LONG, MPI_MAX, comm));
      c->chunk_bytes_ = std::min(static_cast<std::size_t>(chunk), ShmGroup::kChunk / 2);
      c->size_ = p;
      c->nodes_ = p / q;
      c->node_ = a / q;
      e->chain = std::move(c);
    }  // else ~NodeChain frees the node communicator (and any group made on it)
  }
  return CommAttribute<EstablishedChain>::attach(comm, std::move(e))->chain.get();
}

NodeChain::~NodeChain() {
  if (column_ != MPI_COMM_NULL) MPI_Comm_free(&column_);
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);  // frees its ShmGroup
}

int NodeChain::per_node() const { return shm_->size(); }

std::int64_t NodeChain::chunk_elements(DType t) const {
  return static_cast<std::int64_t>(chunk_bytes_ / dtype_size(t));
}

void NodeChain::all_reduce(const std::byte* in, std::byte* out, std::int64_t n, DType t,
                           ReduceOp op) {
  ++calls_;
  const std::size_t e = dtype_size(t), ae = accumulator_size(t);
  // Chunks small enough for the chain's pipeline to fill (4 per node where the message
  // allows: node k starts a chunk when node k-1 has finished it), at least 16 KiB.
  const std::int64_t most = chunk_elements(t);
  const std::int64_t least = std::min(most, static_cast<std::int64_t>((16 << 10) / e));
  const std::int64_t per = std::clamp((n + 4 * nodes_ - 1) / (4 * nodes_), least, most);
  const std::int64_t chunks = (n + per - 1) / per;
  const int q = shm_->size();
  const bool first = node_ == 0, last = node_ == nodes_ - 1;
  const auto part = [&](std::int64_t g) {
    return split_range(std::min(per, n - g * per), q, shm_->index());
  };
  const auto result = [&](std::int64_t g) {  // this device's part of chunk g in out
    return out + static_cast<std::size_t>(g * per + part(g).start) * e;
  };
  // Where this device's part of chunk g starts in carry_ and partial_ (elements).
  std::vector<std::int64_t> start(static_cast<std::size_t>(chunks) + 1, 0);
  for (std::int64_t g = 0; g < chunks; ++g) {
    start[static_cast<std::size_t>(g) + 1] = start[static_cast<std::size_t>(g)] + part(g).size;
  }
  const auto len = [&](std::int64_t g) {
    return start[static_cast<std::size_t>(g) + 1] - start[static_cast<std::size_t>(g)];
  };
  const auto acc = [&](std::vector<std::byte>& v, std::int64_t g) {
    return v.data() + static_cast<std::size_t>(start[static_cast<std::size_t>(g)]) * ae;
  };
  const auto request = [](std::vector<MPI_Request>& v, std::int64_t g) {
    return &v[static_cast<std::size_t>(g)];
  };
  carries_.assign(first ? 0 : static_cast<std::size_t>(chunks), MPI_REQUEST_NULL);
  finals_.assign(last ? 0 : static_cast<std::size_t>(chunks), MPI_REQUEST_NULL);
  sends_.clear();
  std::size_t sent = 0;        // sends_[0, sent) have completed
  const auto progress = [&] {  // also moves the messages in flight along (MPI_Test)
    for (int flag = 1; flag != 0 && sent < sends_.size();) {
      MESHTEST_MPI(MPI_Test(&sends_[sent], &flag, MPI_STATUS_IGNORE));
      if (flag != 0) ++sent;
    }
  };
  if (!first) {
    carry_.resize(static_cast<std::size_t>(start.back()) * ae);
    for (std::int64_t g = 0; g < chunks; ++g) {
      MESHTEST_MPI(MPI_Irecv(acc(carry_, g), bytes(len(g), ae), MPI_BYTE, node_ - 1, kCarryTag,
                             column_, request(carries_, g)));
    }
  }
  if (!last) partial_.resize(static_cast<std::size_t>(start.back()) * ae);
  shm_->reduce_parts(
      in, n, per, t, op,
      [&](std::int64_t g, const Range& r) {
        if (!first) MESHTEST_MPI(MPI_Wait(request(carries_, g), MPI_STATUS_IGNORE));
        return ShmGroup::PartStage{
            .dst = last ? out + static_cast<std::size_t>(g * per + r.start) * e : acc(partial_, g),
            .stage = {.carry = first ? nullptr : acc(carry_, g), .last = last, .total = size_}};
      },
      [&](std::int64_t g) {
        if (!last) {
          MESHTEST_MPI(MPI_Isend(acc(partial_, g), bytes(len(g), ae), MPI_BYTE, node_ + 1,
                                 kCarryTag, column_, &sends_.emplace_back()));
          // The input's part of chunk g is consumed: the result may land on it (in place).
          MESHTEST_MPI(MPI_Irecv(result(g), bytes(len(g), e), MPI_BYTE, nodes_ - 1, kFinalTag,
                                 column_, request(finals_, g)));
        } else {
          for (int k = 0; k + 1 < nodes_; ++k) {
            MESHTEST_MPI(MPI_Isend(result(g), bytes(len(g), e), MPI_BYTE, k, kFinalTag, column_,
                                   &sends_.emplace_back()));
          }
        }
        progress();
      });
  shm_->gather_parts(out, n, per, e, [&](std::int64_t g) {
    if (!last) MESHTEST_MPI(MPI_Wait(request(finals_, g), MPI_STATUS_IGNORE));
    progress();
  });
  MESHTEST_MPI(MPI_Waitall(static_cast<int>(sends_.size() - sent), sends_.data() + sent,
                           MPI_STATUSES_IGNORE));
}

}  // namespace meshtest::dist::detail
