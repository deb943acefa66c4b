// all_to_all and all_to_all_v: blocks along split_dim, placed along concat_dim. The front ends
// agree and plan the blocks; a path moves them (exchange.hpp).
#include "dist/ccl/all_to_all.hpp"

#include <algorithm>
#include <numeric>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/exchange.hpp"
#include "dist/ccl/front_end.hpp"

namespace meshtest::dist {

namespace all_to_all_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_to_all bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace all_to_all_bw

namespace detail {
namespace {

// m[i * p + j]: size along s of the block device i sends to device j (every device holds the
// whole matrix, so every device plans alike).
std::shared_ptr<AllToAllPlan> make_plan(const Call& call, const CclArg& x, int s, int c,
                                        const std::vector<std::int64_t>& m) {
  const auto p = static_cast<std::size_t>(call.size());
  const auto me = static_cast<std::size_t>(call.index());
  const std::int64_t unit = x.shape.outer(s) * x.shape.inner(s);  // agreed outside s
  auto pl = std::make_shared<AllToAllPlan>();
  std::vector<std::int64_t> send(p), recv(p);
  for (std::size_t j = 0; j < p; ++j) {
    std::int64_t total = 0;
    for (std::size_t i = 0; i < p; ++i) total += m[i * p + j] * unit;
    pl->sent.push_back(call.group()[j].shape().numel());
    pl->received.push_back(total);
    send[j] = m[me * p + j];
    recv[j] = m[j * p + me];
  }
  // The received pieces [.., recv[i] along s, ..] are concatenated along c.
  pl->out_shape = c == s
                      ? x.shape.with(s, std::accumulate(recv.begin(), recv.end(), std::int64_t{0}))
                      : x.shape.with(s, recv[0]).with(c, call.size() * x.shape[c]);
  std::vector<std::int64_t> placed = c == s ? recv : std::vector(p, x.shape[c]);
  pl->send_elems = block_elems(x.shape, s, send);
  pl->recv_elems = block_elems(x.shape, s, recv);
  pl->even = std::ranges::all_of(m, [&](std::int64_t v) { return v == m[0]; });
  pl->send = BlockLayout(x.shape, x.dtype, s, std::move(send));
  pl->recv = BlockLayout(pl->out_shape, x.dtype, c, std::move(placed));
  if (pl->even) pl->block_bytes = static_cast<std::size_t>(pl->send_elems[0]) * dtype_size(x.dtype);
  return pl;
}

// The planned exchange of x into the output.
void run(Call& call, const CclArg& x, std::shared_ptr<AllToAllPlan> plan, int s, int c,
         const MakeOutput& make_out) {
  const CclArg out = make_out(plan->out_shape, x.dtype);
  call.perf().attr("split_dim", s).attr("concat_dim", c);
  call.output(out);
  exchange(call, &Path::all_to_all,
           {.in = x.data, .out = out.data, .t = x.dtype, .plan = std::move(plan)});
}

}  // namespace

void all_to_all(const MeshDevice& mesh, const CclArg& x, const AllToAllOptions& opt,
                const MakeOutput& make_out) {
  Call call("all_to_all", mesh, opt.axis, x,
            {{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}});
  const int s = call.dim("split_dim", opt.split_dim);
  const int c = call.dim("concat_dim", opt.concat_dim);
  // Pieces are concatenated along c: unless c == s they must also agree in size along s.
  Agreement a{.free_dim = s, .path = opt.path};
  if (s != c) {
    a = {.free_dim = -1,
         .note = fmt::format(" (split_dim {} differs from concat_dim {}, so the pieces, "
                             "concatenated along dim {}, must also agree along dim {})",
                             s, c, c, s),
         .path = opt.path};
  }
  call.agree({{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}}, a);
  run(call, x, call.plan<AllToAllPlan>([&] {
    // Device i sends split_range(n_i, p, j) along s to device j.
    const int p = call.size();
    std::vector<std::int64_t> m;
    for (const Meta& g : call.group()) {
      for (int j = 0; j < p; ++j)
        m.push_back(split_range(g.dims[static_cast<std::size_t>(s)], p, j).size);
    }
    return make_plan(call, x, s, c, m);
  }),
      s, c, make_out);
}

void all_to_all_v(const MeshDevice& mesh, const CclArg& x,
                  std::span<const std::int64_t> send_counts, const AllToAllOptions& opt,
                  const MakeOutput& make_out) {
  Call call("all_to_all_v", mesh, opt.axis, x,
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
             x.rank() > 0 && sum != x.shape[s]) {
    call.local_error("send_counts sum to {} but x {} has {} along split_dim {}", sum, describe(x),
                     x.shape[s], s);
  }
  call.agree({{"split_dim", opt.split_dim}, {"concat_dim", opt.concat_dim}},
             {.free_dim = s, .path = opt.path});

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
  run(call, x, make_plan(call, x, s, c, m), s, c, make_out);
}

}  // namespace detail

Tensor all_to_all(const MeshDevice& mesh, const Tensor& x, const AllToAllOptions& opt) {
  Tensor out;
  detail::all_to_all(mesh, host_arg(x), opt, host_output(out));
  return out;
}

Tensor all_to_all_v(const MeshDevice& mesh, const Tensor& x,
                    std::span<const std::int64_t> send_counts, const AllToAllOptions& opt) {
  Tensor out;
  detail::all_to_all_v(mesh, host_arg(x), send_counts, opt, host_output(out));
  return out;
}

}  // namespace meshtest::dist
