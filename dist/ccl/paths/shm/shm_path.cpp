// shm_path: the shared-memory path, the collectives of a one-node group through its ShmGroup
// (shm.hpp): all_gather and reduce_scatter of equal pieces, all_reduce, all_to_all of equal
// blocks (unless MPI's single-copy transport moves them faster); it declines the rest. Its
// agreement step is one step in the window, which also carries where each device's operands lie
// in the node arena (read and written in place: ShmGroup::arena_inputs, arena_outputs); the
// window is made once a group has first agreed over MPI.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "dist/ccl/arena/arena.hpp"
#include "dist/ccl/detail.hpp"
#include "dist/ccl/path_registry.hpp"
#include "dist/ccl/paths/shm/shm.hpp"

namespace meshtest::dist::detail {
namespace {

/// reduce_scatter's input blocks end to end, when its dim is not leading.
struct PackedInput : PathState {
  std::vector<std::byte> bytes;
};

/// The group of the call's communicator (an attribute lookup); applies() has found one.
ShmGroup* group(const Call& call) { return ShmGroup::find(call.comm()); }

/// A host operand's offset in the node arena, or ShmWindow::kNoHandle.
std::uint64_t arena_handle(const CclArg* t) {
  return t != nullptr && t->where.is_host() && !t->empty()
             ? NodeArena::offset_in_open(t->data, t->nbytes()).value_or(ShmWindow::kNoHandle)
             : ShmWindow::kNoHandle;
}

class ShmPath final : public Path {
 public:
  const PathInfo& info() const override {
    static constexpr PathInfo kInfo{
        .name = "shm", .memory = Memory::Kind::host, .reach = Reach::one_node, .priority = 300};
    return kInfo;
  }
  bool applies(const Call& call) const override { return group(call) != nullptr; }
  std::optional<bool> agree_step(MPI_Comm comm, std::uint64_t hash, bool error, const CclArg& in,
                                 const CclArg* out) override {
    ShmGroup* g = ShmGroup::find(comm);
    if (g == nullptr) return std::nullopt;
    return g->agree(hash, error, arena_handle(&in), arena_handle(out));
  }
  void agreed(MPI_Comm comm) override { ShmGroup::establish(comm); }
  std::string status(MPI_Comm comm) const override {
    const ShmGroup* g = ShmGroup::find(comm);
    return g == nullptr ? std::string()
                        : fmt::format(
                              "the shared-memory ring of {} devices on one node "
                              "(MESHTEST_CCL_SHM=0 turns it off)",
                              g->size());
  }
  std::optional<PathTraffic> traffic(MPI_Comm comm) const override {
    const ShmGroup* g = ShmGroup::find(comm);
    if (g == nullptr) return std::nullopt;
    const auto t = g->traffic();
    return PathTraffic{.steps = t.steps, .written = t.written, .read = t.read};
  }

  bool all_gather(Call& call, const AllGatherExchange& x) override {
    if (!x.plan->even) return false;
    const std::size_t piece =
        static_cast<std::size_t>(x.plan->elems[static_cast<std::size_t>(call.index())]) *
        dtype_size(x.t);
    if (auto peers = group(call)->arena_inputs(); !peers.empty()) {
      call.run([g = group(call), peers = std::move(peers), out = x.out, pl = x.plan, piece] {
        g->arena_all_gather(peers, pl->layout, out, piece);  // read in place
      });
      return true;
    }
    call.run([g = group(call), in = x.in, out = x.out, pl = x.plan, piece] {
      g->all_gather(in, pl->layout, out, piece);  // unpacked straight from the slots
    });
    return true;
  }

  bool reduce_scatter(Call& call, const ReduceScatterExchange& x) override {
    if (!x.plan->even) return false;
    auto& ws = x.plan->state<PackedInput>(this, [] { return std::make_unique<PackedInput>(); });
    const std::int64_t n = x.plan->elems[static_cast<std::size_t>(call.index())];
    const std::size_t bytes = call.input().nbytes();
    if (auto peers = group(call)->arena_inputs(); !peers.empty() && x.plan->layout.direct()) {
      call.run([g = group(call), peers = std::move(peers), out = x.out, t = x.t, op = x.op, n] {
        g->arena_reduce_scatter(peers, out, n, t, op);
      });
      return true;
    }
    call.run(
        [g = group(call), in = x.in, out = x.out, t = x.t, op = x.op, pl = x.plan, ws = &ws, n,
         bytes] { g->reduce_scatter(pl->layout.packed(in, ws->bytes, bytes), out, n, t, op); });
    return true;
  }

  bool all_reduce(Call& call, const AllReduceExchange& x) override {
    if (auto peers = group(call)->arena_inputs(); !peers.empty()) {
      if (auto outs = group(call)->arena_outputs(); !outs.empty()) {
        call.run([g = group(call), peers = std::move(peers), outs = std::move(outs), n = x.n,
                  t = x.t, op = x.op] { g->arena_all_reduce_to(peers, outs, n, t, op); });
        return true;
      }
      call.run([g = group(call), peers = std::move(peers), out = x.out, n = x.n, t = x.t,
                op = x.op] { g->arena_all_reduce(peers, out, n, t, op); });
      return true;
    }
    call.run([g = group(call), in = x.in, out = x.out, n = x.n, t = x.t, op = x.op] {
      g->all_reduce(in, out, n, t, op);
    });
    return true;
  }

  bool all_to_all(Call& call, const AllToAllExchange& x) override {
    const AllToAllPlan& pl = *x.plan;
    if (auto peers = group(call)->arena_inputs(); pl.even && !peers.empty() && pl.send.direct()) {
      call.run([g = group(call), peers = std::move(peers), out = x.out, pl = x.plan] {
        g->arena_all_to_all(peers, pl->recv, out, pl->block_bytes);
      });
      return true;
    }
    if (!pl.even ||
        !group(call)->window_all_to_all(pl.block_bytes, !pl.send.direct() || !pl.recv.direct())) {
      return false;
    }
    call.run([g = group(call), in = x.in, out = x.out, pl = x.plan] {
      // packs and unpacks range by range on the way through the slots
      g->all_to_all(pl->send, in, pl->recv, out, pl->block_bytes);
    });
    return true;
  }
};

}  // namespace

void install_shm_path() {
  static ShmPath path;
  register_path(path);
}

}  // namespace meshtest::dist::detail
