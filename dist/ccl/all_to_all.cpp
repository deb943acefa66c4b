// all_to_all and all_to_all_v: blocks along split_dim, placed along concat_dim, through the
// shared-memory group (equal blocks, one node) or MPI_Alltoall(v) of contiguous blocks.
#include "dist/ccl/all_to_all.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/shm.hpp"

namespace meshtest::dist {

namespace all_to_all_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_to_all bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace all_to_all_bw

namespace {

// Everything one exchange needs: shapes, MPI counts, layouts and pack workspaces.
struct AllToAllPlan : perf::Plan {
  Shape out_shape;
  std::vector<int> sc, sd, rc, rd;          // send / receive counts and displacements (elements)
  bool even = false;                        // every block the same size: MPI_Alltoall
  detail::BlockLayout send, recv;           // blocks along split_dim of x, along concat_dim of out
  std::vector<std::byte> send_ws, recv_ws;  // MPI path: blocks end to end, for a strided side
  std::size_t block_bytes = 0;              // even: the bytes of every block
};

// m[i * p + j]: size along s of the block device i sends to device j (every device holds the
// whole matrix, so the count checks below throw alike everywhere).
std::shared_ptr<AllToAllPlan> make_plan(const detail::Call& call, const Tensor& x, int s, int c,
                                        const std::vector<std::int64_t>& m) {
  const auto p = static_cast<std::size_t>(call.size());
  const auto me = static_cast<std::size_t>(call.index());
  const std::int64_t unit = x.shape().outer(s) * x.shape().inner(s);  // agreed outside s
  std::vector<std::int64_t> send(p), recv(p);
  for (std::size_t j = 0; j < p; ++j) {
    std::int64_t total = 0;
    for (std::size_t i = 0; i < p; ++i) total += m[i * p + j] * unit;
    call.count(call.group()[j].shape().numel(), "a device's send buffer");
    call.count(total, "a device's receive buffer");
    send[j] = m[me * p + j];
    recv[j] = m[j * p + me];
  }
  auto pl = std::make_shared<AllToAllPlan>();
  // The received pieces [.., recv[i] along s, ..] are concatenated along c.
  pl->out_shape =
      c == s ? x.shape().with(s, std::accumulate(recv.begin(), recv.end(), std::int64_t{0}))
             : x.shape().with(s, recv[0]).with(c, call.size() * x.shape()[c]);
  std::vector<std::int64_t> placed = c == s ? recv : std::vector(p, x.shape()[c]);
  std::tie(pl->sc, pl->sd) = call.counts(detail::block_elems(x.shape(), s, send), "a send block");
  std::tie(pl->rc, pl->rd) =
      call.counts(detail::block_elems(x.shape(), s, recv), "a receive block");
  pl->even = std::ranges::all_of(m, [&](std::int64_t v) { return v == m[0]; });
  const std::size_t e = dtype_size(x.dtype());
  pl->send = detail::BlockLayout(x.shape(), x.dtype(), s, std::move(send));
  pl->recv = detail::BlockLayout(pl->out_shape, x.dtype(), c, std::move(placed));
  if (pl->even) pl->block_bytes = static_cast<std::size_t>(pl->sc[0]) * e;
  return pl;
}

// Runs the planned exchange of x into a new tensor (and records it while tracing). Blocks
// that are not contiguous (split or concat dim not leading) are packed end to end first and
// unpacked after: MPI only ever sees contiguous buffers of its own basic types. (Open MPI
// 4.1's modified Bruck alltoall, which its tuned component picks for large groups and small
// blocks, corrupts data given a datatype whose extent is smaller than its span, such as one
// block of a strided layout; test_ccl_mpi_algorithms forces each algorithm.)
Tensor exchange(const detail::Call& call, const Tensor& x, std::shared_ptr<AllToAllPlan> plan) {
  Tensor out(plan->out_shape, x.dtype(), Tensor::Uninitialized{});
  // Equal blocks go through the shared-memory group when there is one, unless MPI's single-copy
  // transport moves them faster (ShmGroup::window_all_to_all).
  detail::ShmGroup* shm = plan->even ? call.shm() : nullptr;
  if (shm != nullptr &&
      !shm->window_all_to_all(plan->block_bytes, !plan->send.direct() || !plan->recv.direct())) {
    shm = nullptr;
  }
  auto run = [pl = std::move(plan), in = x.bytes(), o = out.bytes(), in_bytes = x.nbytes(),
              out_bytes = out.nbytes(), t = detail::mpi_type(x.dtype()), comm = call.comm(), shm] {
    if (shm != nullptr) {  // packs and unpacks range by range on the way through the slots
      shm->all_to_all(pl->send, in, pl->recv, o, pl->block_bytes);
      return;
    }
    const std::byte* sb = in;
    if (!pl->send.direct()) {
      pl->send_ws.resize(in_bytes);  // the first call allocates; the plan keeps it
      pl->send.pack(in, pl->send_ws.data());
      sb = pl->send_ws.data();
    }
    if (!pl->recv.direct()) pl->recv_ws.resize(out_bytes);
    std::byte* rb = pl->recv.direct() ? o : pl->recv_ws.data();
    auto* send = const_cast<std::byte*>(sb);  // read only: MPI's send buffers are void*
    if (pl->even) {
      MESHTEST_MPI(MPI_Alltoall(send, pl->sc[0], t, rb, pl->rc[0], t, comm));
    } else {
      MESHTEST_MPI(MPI_Alltoallv(send, pl->sc.data(), pl->sd.data(), t, rb, pl->rc.data(),
                                 pl->rd.data(), t, comm));
    }
    if (!pl->recv.direct()) pl->recv.unpack(rb, o);
  };
  run();
  call.trace(out, run);
  return out;
}

}  // namespace

Tensor all_to_all(const MeshDevice& mesh, const Tensor& x, const AllToAllOptions& opt) {
  detail::Call call("all_to_all", mesh, opt.axis, x,
                    {{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}});
  const int s = call.dim("split_dim", opt.split_dim);
  const int c = call.dim("concat_dim", opt.concat_dim);
  // Pieces are concatenated along c: unless c == s they must also agree in size along s.
  detail::Agreement a{.free_dim = s};
  if (s != c) {
    a = {.free_dim = -1,
         .note = fmt::format(" (split_dim {} differs from concat_dim {}, so the pieces, "
                             "concatenated along dim {}, must also agree along dim {})",
                             s, c, c, s)};
  }
  call.agree({{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}}, a);
  Tensor out = exchange(call, x, call.plan<AllToAllPlan>([&] {
    // Device i sends split_range(n_i, p, j) along s to device j.
    const int p = call.size();
    std::vector<std::int64_t> m;
    for (const detail::Meta& g : call.group()) {
      for (int j = 0; j < p; ++j)
        m.push_back(split_range(g.dims[static_cast<std::size_t>(s)], p, j).size);
    }
    return make_plan(call, x, s, c, m);
  }));
  call.perf().attr("split_dim", s).attr("concat_dim", c).output(out);
  return out;
}

Tensor all_to_all_v(const MeshDevice& mesh, const Tensor& x,
                    std::span<const std::int64_t> send_counts, const AllToAllOptions& opt) {
  detail::Call call("all_to_all_v", mesh, opt.axis, x,
                    {{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}});
  const int s = call.dim("split_dim", opt.split_dim);
  const int c = call.dim("concat_dim", opt.concat_dim);
  const auto p = static_cast<std::size_t>(call.size());
  if (send_counts.size() != p) {
    call.local_error("send_counts has {} entries but the axis group has {} devices",
                     send_counts.size(), p);
  } else if (const auto neg = std::ranges::find_if(send_counts, [](auto n) { return n < 0; });
             neg != send_counts.end()) {
    call.local_error("send_counts[{}] is {}; counts must be >= 0", neg - send_counts.begin(), *neg);
  } else if (const std::int64_t sum =
                 std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
             x.rank() > 0 && sum != x.shape()[s]) {
    call.local_error("send_counts sum to {} but x {} has {} along split_dim {}", sum, describe(x),
                     x.shape()[s], s);
  }
  call.agree({{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}}, {.free_dim = s});

  std::vector<std::int64_t> m(p * p);
  MESHTEST_MPI(MPI_Allgather(send_counts.data(), static_cast<int>(p), MPI_INT64_T, m.data(),
                             static_cast<int>(p), MPI_INT64_T, call.comm()));
  for (std::size_t j = 0; c != s && j < p; ++j) {
    for (std::size_t i = 1; i < p; ++i) {
      if (m[i * p + j] != m[j]) {
        call.fail(
            "split_dim {} != concat_dim {}: the pieces device {} receives are concatenated "
            "along dim {}, so they must agree in size along dim {}, but it gets {} from {} "
            "and {} from {}",
            s, c, call.group()[j].device, c, s, m[j], call.who(0), m[i * p + j],
            call.who(static_cast<int>(i)));
      }
    }
  }
  // Counts vary per call: planned afresh, not cached.
  Tensor out = exchange(call, x, make_plan(call, x, s, c, m));
  call.perf().attr("split_dim", s).attr("concat_dim", c).output(out);
  return out;
}

}  // namespace meshtest::dist
