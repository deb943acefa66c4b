// reduce_scatter: MPI_Reduce_scatter over array_split blocks of `dim`.
#include "dist/ccl/reduce_scatter.hpp"

#include "dist/ccl/detail.hpp"

namespace meshtest::dist {

namespace reduce_scatter_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "reduce_scatter bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace reduce_scatter_bw

Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x, const ReduceScatterOptions& opt) {
  detail::Call call("reduce_scatter", mesh, opt.axis, x,
                    fmt::format("dim {} op {}", opt.dim, reduce_op_name(opt.op)));
  const int d = call.dim("dim", opt.dim);
  call.agree(
      {{"dim", opt.dim}, {"op", static_cast<std::int64_t>(opt.op), &detail::show_reduce_op}});
  const MPI_Op op = call.reduce_op(opt.op, x.dtype());

  // Device i keeps split_range(n, p, i) along d; block i is packed contiguous for MPI.
  const std::vector<std::int64_t> sizes = split_sizes(x.shape()[d], call.size());
  Tensor out(x.shape().with(d, sizes[static_cast<std::size_t>(call.index())]), x.dtype());
  call.perf().attr("dim", d).attr("op", reduce_op_name(opt.op)).output(out);
  call.count(x.numel(), "the input");
  const auto [counts, displs] = call.counts(detail::block_elems(x.shape(), d, sizes), "a block");
  if (x.empty()) return out;

  const detail::SendBlocks send(x, d, sizes);
  MESHTEST_MPI(MPI_Reduce_scatter(send.data(), out.bytes(), counts.data(),
                                  detail::mpi_type(x.dtype()), op, call.comm()));
  detail::finish_avg(out, opt.op, call.size());
  return out;
}

}  // namespace meshtest::dist
