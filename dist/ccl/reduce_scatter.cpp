// reduce_scatter: the shared-memory ring for equal blocks on one node (shm.hpp), else a direct
// point-to-point exchange of array_split blocks of `dim`, then a local reduction.
#include "dist/ccl/reduce_scatter.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/private_comm.hpp"
#include "dist/ccl/reduce.hpp"
#include "dist/ccl/shm.hpp"

#include <algorithm>

namespace meshtest::dist {

namespace reduce_scatter_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "reduce_scatter bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace reduce_scatter_bw

namespace {
// Equal blocks on one node: the shared-memory group (shm.hpp). Otherwise the direct exchange
// (reduce.hpp): every device sends block j of x straight to device j and reduces the p blocks
// it receives in axis order — (p-1)/p of x sent once, half of what MPI_Allreduce moves, in one
// step, while Open MPI 4.1's MPI_Reduce_scatter(_block) runs far below that on one node. The
// messages go on a private duplicate of the axis communicator (detail::private_comm), so a
// receive the user posts on mesh.comm() (even MPI_ANY_SOURCE / MPI_ANY_TAG) never matches them.
struct ReduceScatterPlan : perf::Plan {
  Shape out_shape;
  detail::BlockLayout layout;       // blocks along d of x
  std::vector<std::byte> packed;    // x's blocks end to end (when not direct)
  detail::DirectReduceScatter mpi;  // the MPI path's exchange and its workspaces
  bool even = false;                // every block has the same size
};
}  // namespace

Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x, const ReduceScatterOptions& opt) {
  detail::Call call("reduce_scatter", mesh, opt.axis, x,
                    {{"dim", opt.dim}, {.key = "op", .text = reduce_op_name(opt.op)}});
  const int d = call.dim("dim", opt.dim);
  call.agree(
      {{"dim", opt.dim}, {"op", static_cast<std::int64_t>(opt.op), &detail::show_reduce_op}});
  call.check_reduce_op(opt.op, x.dtype());
  const auto plan = call.plan<ReduceScatterPlan>([&] {
    // Device i keeps split_range(n, p, i) along d.
    auto pl = std::make_shared<ReduceScatterPlan>();
    std::vector<std::int64_t> sizes = split_sizes(x.shape()[d], call.size());
    pl->out_shape = x.shape().with(d, sizes[static_cast<std::size_t>(call.index())]);
    call.count(x.numel(), "the input");
    std::vector<int> counts =
        call.counts(detail::block_elems(x.shape(), d, sizes), "a block").first;
    pl->layout = detail::BlockLayout(x.shape(), x.dtype(), d, std::move(sizes));
    if (!pl->layout.direct()) pl->packed.resize(x.nbytes());
    pl->even = std::ranges::all_of(counts, [&](int c) { return c == counts[0]; });
    pl->mpi = detail::DirectReduceScatter(std::move(counts), x.dtype(), call.index());
    return pl;
  });
  Tensor out(plan->out_shape, x.dtype(), Tensor::Uninitialized{});
  call.perf().attr("dim", d).attr("op", reduce_op_name(opt.op)).output(out);
  if (x.empty()) return out;

  // Equal blocks go through the shared-memory group when there is one (packed first when the
  // dim is not leading).
  detail::ShmGroup* shm = plan->even ? call.shm() : nullptr;
  auto exchange = [pl = plan, in = x.bytes(), o = out.bytes(), n = out.numel(),
                   t = detail::mpi_type(x.dtype()), dt = x.dtype(), rop = opt.op,
                   comm = call.size() > 1 && shm == nullptr ? detail::private_comm(call.comm())
                                                            : MPI_COMM_NULL,
                   shm] {
    const std::byte* packed = in;
    if (!pl->layout.direct()) {
      pl->layout.pack(in, pl->packed.data());
      packed = pl->packed.data();
    }
    if (shm != nullptr) {
      shm->reduce_scatter(packed, o, n, dt, rop);
    } else {
      pl->mpi.run(packed, o, t, rop, comm);
    }
  };
  exchange();
  call.trace(out, exchange);
  return out;
}

}  // namespace meshtest::dist
