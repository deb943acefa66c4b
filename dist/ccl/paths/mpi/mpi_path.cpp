// mpi_path: the MPI path, which takes every exchange of host memory on any group (the last of
// the order): point-to-point messages and MPI collectives on packed, contiguous buffers of MPI's
// basic types (never a derived datatype of interleaved pieces), within a node over Open MPI's
// shared-memory transport and between nodes over the network: MPI_Allgather(v), the direct
// reduce-scatter (direct_reduce_scatter.hpp) and MPI_Allgatherv, MPI_Alltoall(v), MPI_Bcast. MPI
// counts are ints: a buffer of more than INT_MAX elements is an Error. Its per-plan state lives
// in the plans; its messages on the group's communicator or its private duplicate
// (private_comm.hpp).

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/mpi_types.hpp"
#include "dist/ccl/path_registry.hpp"
#include "dist/ccl/paths/mpi/direct_reduce_scatter.hpp"
#include "dist/ccl/private_comm.hpp"

namespace meshtest::dist::detail {
namespace {

struct GatherState : PathState {
  std::vector<int> counts, displs;   // every piece, elements
  std::vector<std::byte> workspace;  // the pieces end to end, when the dim is not leading
};

struct ReduceScatterState : PathState {
  DirectReduceScatter rs;
  std::vector<std::byte> packed;  // the input's blocks end to end, when the dim is not leading
};

// all_reduce: the flat tensor in array_split parts; device i reduces part i of every device's
// tensor (DirectReduceScatter), then MPI_Allgatherv spreads the reduced parts. Both halves move
// the bandwidth minimum, (p-1)/p of the tensor each way, and MPI's choice of algorithm can
// reorder no addition (MPI_Allreduce may). all_reduce has no front-end plan: this is the plan.
struct AllReducePlan : perf::Plan {
  DirectReduceScatter rs;
  std::vector<int> displs;  // elements
};

struct AllToAllState : PathState {
  std::vector<int> sc, sd, rc, rd;          // send / receive counts and displacements (elements)
  std::vector<std::byte> send_ws, recv_ws;  // blocks end to end, for a strided side
};

class MpiPath final : public Path {
 public:
  const PathInfo& info() const override {
    static constexpr PathInfo kInfo{
        .name = "mpi", .memory = Memory::Kind::host, .reach = Reach::any, .priority = 100};
    return kInfo;
  }
  std::string status(MPI_Comm /*comm*/) const override {
    return "MPI's own collectives (every call the paths above decline)";
  }

  // Pieces along a dim that is not leading are gathered end to end and unpacked: MPI only ever
  // sees contiguous buffers of its basic types (see all_to_all).
  bool all_gather(Call& call, const AllGatherExchange& x) override {
    auto& s = x.plan->state<GatherState>(this, [&] {
      const BlockPlan& pl = *x.plan;
      auto st = std::make_unique<GatherState>();
      call.count(pl.out_shape.numel(), "the gathered output");
      std::tie(st->counts, st->displs) = call.counts(pl.elems, "a piece");
      if (!pl.layout.direct()) {
        st->workspace.resize(static_cast<std::size_t>(pl.out_shape.numel()) * dtype_size(x.t));
      }
      return st;
    });
    call.run([pl = x.plan, s = &s, in = x.in, o = x.out, t = mpi_type(x.t),
              me = static_cast<std::size_t>(call.index()), comm = call.comm()] {
      std::byte* recv = pl->layout.direct() ? o : s->workspace.data();
      if (pl->even) {
        MESHTEST_MPI(MPI_Allgather(in, s->counts[me], t, recv, s->counts[me], t, comm));
      } else {
        MESHTEST_MPI(MPI_Allgatherv(in, s->counts[me], t, recv, s->counts.data(), s->displs.data(),
                                    t, comm));
      }
      if (!pl->layout.direct()) pl->layout.unpack(recv, o);
    });
    return true;
  }

  // The direct exchange (direct_reduce_scatter.hpp): every device sends block j of x straight
  // to device j and reduces the p blocks it receives in axis order — (p-1)/p of x sent once,
  // half of what MPI_Allreduce moves, in one step, while Open MPI 4.1's
  // MPI_Reduce_scatter(_block) runs far below that on one node. The messages go on a private
  // duplicate of the axis communicator (private_comm), so a receive the user posts on
  // mesh.comm() (even MPI_ANY_SOURCE / MPI_ANY_TAG) never matches them.
  bool reduce_scatter(Call& call, const ReduceScatterExchange& x) override {
    auto& s = x.plan->state<ReduceScatterState>(this, [&] {
      auto st = std::make_unique<ReduceScatterState>();
      std::int64_t n = 0;
      for (std::int64_t e : x.plan->elems) n += e;
      call.count(n, "the input");
      st->rs = DirectReduceScatter(call.counts(x.plan->elems, "a block").first, x.t, call.index());
      return st;
    });
    const std::size_t bytes = call.input().nbytes();
    call.run([pl = x.plan, s = &s, in = x.in, o = x.out, t = mpi_type(x.t), op = x.op,
              comm = call.size() > 1 ? private_comm(call.comm()) : MPI_COMM_NULL,
              bytes] { s->rs.run(pl->layout.packed(in, s->packed, bytes), o, t, op, comm); });
    return true;
  }

  bool all_reduce(Call& call, const AllReduceExchange& x) override {
    const int count = call.count(x.n, "the tensor");
    const auto plan = call.plan<AllReducePlan>([&] {
      auto pl = std::make_shared<AllReducePlan>();
      auto [counts, displs] = call.counts(split_sizes(count, call.size()), "a part");
      pl->displs = std::move(displs);
      pl->rs = DirectReduceScatter(std::move(counts), x.t, call.index());
      return pl;
    });
    call.run([pl = plan, in = x.in, out = x.out, t = mpi_type(x.t), e = dtype_size(x.t), op = x.op,
              comm = private_comm(call.comm()), r = static_cast<std::size_t>(call.index())] {
      pl->rs.run(in, out + static_cast<std::size_t>(pl->displs[r]) * e, t, op, comm);
      MESHTEST_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, pl->rs.counts().data(),
                                  pl->displs.data(), t, comm));
    });
    return true;
  }

  // Blocks that are not contiguous (split or concat dim not leading) are packed end to end first
  // and unpacked after: MPI only ever sees contiguous buffers of its own basic types. (Open
  // MPI 4.1's modified Bruck alltoall, which its tuned component picks for large groups and
  // small blocks, corrupts data given a datatype whose extent is smaller than its span, such as
  // one block of a strided layout; test_ccl_mpi_algorithms forces each algorithm.)
  bool all_to_all(Call& call, const AllToAllExchange& x) override {
    auto& s = x.plan->state<AllToAllState>(this, [&] {
      const AllToAllPlan& pl = *x.plan;
      auto st = std::make_unique<AllToAllState>();
      for (std::size_t j = 0; j < pl.sent.size(); ++j) {
        call.count(pl.sent[j], "a device's send buffer");
        call.count(pl.received[j], "a device's receive buffer");
      }
      std::tie(st->sc, st->sd) = call.counts(pl.send_elems, "a send block");
      std::tie(st->rc, st->rd) = call.counts(pl.recv_elems, "a receive block");
      return st;
    });
    const std::size_t e = dtype_size(x.t);
    call.run([pl = x.plan, s = &s, in = x.in, o = x.out, t = mpi_type(x.t),
              in_bytes = call.input().nbytes(),
              out_bytes = static_cast<std::size_t>(x.plan->out_shape.numel()) * e,
              comm = call.comm()] {
      // read only: MPI's send buffers are void*
      auto* send = const_cast<std::byte*>(pl->send.packed(in, s->send_ws, in_bytes));
      if (!pl->recv.direct()) s->recv_ws.resize(out_bytes);  // the first call allocates
      std::byte* rb = pl->recv.direct() ? o : s->recv_ws.data();
      if (pl->even) {
        MESHTEST_MPI(MPI_Alltoall(send, s->sc[0], t, rb, s->rc[0], t, comm));
      } else {
        MESHTEST_MPI(MPI_Alltoallv(send, s->sc.data(), s->sd.data(), t, rb, s->rc.data(),
                                   s->rd.data(), t, comm));
      }
      if (!pl->recv.direct()) pl->recv.unpack(rb, o);
    });
    return true;
  }

  // Not recorded in a trace (a broadcast is not replayed).
  bool broadcast(Call& call, const BroadcastExchange& x) override {
    const int count = call.count(x.n, "the root's tensor");
    if (call.index() == x.root && x.out != x.in) {
      std::memcpy(x.out, x.in, static_cast<std::size_t>(x.n) * dtype_size(x.t));
    }
    MESHTEST_MPI(MPI_Bcast(x.out, count, mpi_type(x.t), x.root, call.comm()));
    return true;
  }
};

}  // namespace

void install_mpi_path() {
  static MpiPath path;
  register_path(path);
}

}  // namespace meshtest::dist::detail
