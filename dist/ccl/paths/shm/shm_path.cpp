// shm_path: each exchange of the shared-memory path as one call on the group's ShmGroup.
#include "dist/ccl/paths/shm/shm_path.hpp"

#include <vector>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/paths/shm/shm.hpp"

namespace meshtest::dist::detail {
namespace {

/// reduce_scatter's input blocks end to end, when its dim is not leading.
struct PackedInput : PathState {
  std::vector<std::byte> bytes;
};

class ShmPath final : public Path {
 public:
  PathKind kind() const override { return PathKind::shm; }

  bool all_gather(Call& call, const AllGatherExchange& x) override {
    if (!x.plan->even) return false;
    const std::size_t piece =
        static_cast<std::size_t>(x.plan->elems[static_cast<std::size_t>(call.index())]) *
        dtype_size(x.t);
    if (auto peers = call.shm()->arena_inputs(); !peers.empty()) {
      call.run([g = call.shm(), peers = std::move(peers), out = x.out, pl = x.plan, piece] {
        g->arena_all_gather(peers, pl->layout, out, piece);  // read in place
      });
      return true;
    }
    call.run([g = call.shm(), in = x.in, out = x.out, pl = x.plan, piece] {
      g->all_gather(in, pl->layout, out, piece);  // unpacked straight from the slots
    });
    return true;
  }

  bool reduce_scatter(Call& call, const ReduceScatterExchange& x) override {
    if (!x.plan->even) return false;
    auto& ws = x.plan->state<PackedInput>(kind(), [] { return std::make_unique<PackedInput>(); });
    const std::int64_t n = x.plan->elems[static_cast<std::size_t>(call.index())];
    const std::size_t bytes = call.input().nbytes();
    if (auto peers = call.shm()->arena_inputs(); !peers.empty() && x.plan->layout.direct()) {
      call.run([g = call.shm(), peers = std::move(peers), out = x.out, t = x.t, op = x.op, n] {
        g->arena_reduce_scatter(peers, out, n, t, op);
      });
      return true;
    }
    call.run(
        [g = call.shm(), in = x.in, out = x.out, t = x.t, op = x.op, pl = x.plan, ws = &ws, n,
         bytes] { g->reduce_scatter(pl->layout.packed(in, ws->bytes, bytes), out, n, t, op); });
    return true;
  }

  bool all_reduce(Call& call, const AllReduceExchange& x) override {
    if (auto peers = call.shm()->arena_inputs(); !peers.empty()) {
      if (auto outs = call.shm()->arena_outputs(); !outs.empty()) {
        call.run([g = call.shm(), peers = std::move(peers), outs = std::move(outs), n = x.n,
                  t = x.t, op = x.op] { g->arena_all_reduce_to(peers, outs, n, t, op); });
        return true;
      }
      call.run([g = call.shm(), peers = std::move(peers), out = x.out, n = x.n, t = x.t,
                op = x.op] { g->arena_all_reduce(peers, out, n, t, op); });
      return true;
    }
    call.run([g = call.shm(), in = x.in, out = x.out, n = x.n, t = x.t, op = x.op] {
      g->all_reduce(in, out, n, t, op);
    });
    return true;
  }

  bool all_to_all(Call& call, const AllToAllExchange& x) override {
    const AllToAllPlan& pl = *x.plan;
    if (auto peers = call.shm()->arena_inputs(); pl.even && !peers.empty() && pl.send.direct()) {
      call.run([g = call.shm(), peers = std::move(peers), out = x.out, pl = x.plan] {
        g->arena_all_to_all(peers, pl->recv, out, pl->block_bytes);
      });
      return true;
    }
    if (!pl.even ||
        !call.shm()->window_all_to_all(pl.block_bytes, !pl.send.direct() || !pl.recv.direct())) {
      return false;
    }
    call.run([g = call.shm(), in = x.in, out = x.out, pl = x.plan] {
      // packs and unpacks range by range on the way through the slots
      g->all_to_all(pl->send, in, pl->recv, out, pl->block_bytes);
    });
    return true;
  }
};

}  // namespace

Path& shm_path() {
  static ShmPath path;
  return path;
}

}  // namespace meshtest::dist::detail
