// reduce_scatter: MPI_Allreduce into a planned workspace, then this device's array_split slice.
#include "dist/ccl/reduce_scatter.hpp"

#include "dist/ccl/detail.hpp"

#include <cstring>

namespace meshtest::dist {

namespace reduce_scatter_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "reduce_scatter bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace reduce_scatter_bw

namespace {
// Reduce-scatter as MPI_Allreduce into a workspace, then this device's slice: Open MPI 4.1's
// MPI_Reduce_scatter(_block) runs far below MPI_Allreduce's bandwidth on one node, and the
// slice copy is one pass of memcpy runs. Every device reduces the same elements in the same
// MPI_Allreduce, so the result is the one MPI gives, for uneven array_split slices too.
struct Plan : perf::Plan {
  Shape out_shape;
  int count = 0;           // elements of x
  std::size_t offset = 0;  // byte offset of this device's slice in a row of x
  std::size_t run = 0;     // bytes of the slice per row
  std::size_t row = 0;     // bytes of a row of x ([outer, n, inner]: n * inner)
  std::int64_t outer = 1;
  std::vector<std::byte> workspace;  // the reduced x
};
}  // namespace

Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x, const ReduceScatterOptions& opt) {
  detail::Call call("reduce_scatter", mesh, opt.axis, x,
                    {{"dim", opt.dim}, {.key = "op", .text = reduce_op_name(opt.op)}});
  const int d = call.dim("dim", opt.dim);
  call.agree(
      {{"dim", opt.dim}, {"op", static_cast<std::int64_t>(opt.op), &detail::show_reduce_op}});
  const MPI_Op op = call.reduce_op(opt.op, x.dtype());
  const auto plan = call.plan<Plan>([&] {
    // Device i keeps split_range(n, p, i) along d.
    auto pl = std::make_shared<Plan>();
    const Range r = split_range(x.shape()[d], call.size(), call.index());
    const detail::DimView v = detail::dim_view(x.shape(), x.dtype(), d);
    pl->out_shape = x.shape().with(d, r.size);
    pl->count = call.count(x.numel(), "the input");
    pl->offset = static_cast<std::size_t>(r.start) * v.inner_bytes;
    pl->run = static_cast<std::size_t>(r.size) * v.inner_bytes;
    pl->row = static_cast<std::size_t>(x.shape()[d]) * v.inner_bytes;
    pl->outer = v.outer;
    pl->workspace.resize(x.nbytes());
    return pl;
  });
  Tensor out(plan->out_shape, x.dtype(), Tensor::Uninitialized{});
  call.perf().attr("dim", d).attr("op", reduce_op_name(opt.op)).output(out);
  if (x.empty()) return out;

  auto exchange = [pl = plan, in = x.bytes(), o = out.bytes(), n = out.numel(),
                   t = detail::mpi_type(x.dtype()), dt = x.dtype(), op, rop = opt.op,
                   comm = call.comm(), p = call.size()] {
    std::byte* all = pl->workspace.data();
    MESHTEST_MPI(MPI_Allreduce(in, all, pl->count, t, op, comm));
    for (std::int64_t i = 0; pl->run > 0 && i < pl->outer; ++i) {
      const auto k = static_cast<std::size_t>(i);
      std::memcpy(o + k * pl->run, all + k * pl->row + pl->offset, pl->run);
    }
    detail::finish_avg(o, n, dt, rop, p);
  };
  exchange();
  call.trace(out, exchange);
  return out;
}

}  // namespace meshtest::dist
