// all_gather: MPI_Allgatherv of each device's piece, placed along `dim` in axis order.
#include "dist/ccl/all_gather.hpp"

#include "dist/ccl/detail.hpp"

namespace meshtest::dist {

namespace all_gather_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_gather bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace all_gather_bw

Tensor all_gather(const MeshDevice& mesh, const Tensor& x, const AllGatherOptions& opt) {
  detail::Call call("all_gather", mesh, opt.axis, x, fmt::format("dim {}", opt.dim));
  const int d = call.dim("dim", opt.dim);
  call.agree({{"dim", opt.dim}}, {.free_dim = d});

  // Device i contributes n_i along d (any sizes, e.g. array_split shards).
  std::vector<std::int64_t> sizes;
  std::int64_t n = 0;
  for (const detail::Meta& m : call.group()) {
    sizes.push_back(m.dims[static_cast<std::size_t>(d)]);
    n += sizes.back();
  }
  Tensor out(x.shape().with(d, n), x.dtype());
  call.perf().attr("dim", d).output(out);
  call.count(out.numel(), "the gathered output");
  const auto [counts, displs] = call.counts(detail::block_elems(x.shape(), d, sizes), "a piece");
  if (out.empty()) return out;

  detail::RecvBlocks recv(out, d, sizes);
  const MPI_Datatype type = detail::mpi_type(x.dtype());
  MESHTEST_MPI(MPI_Allgatherv(x.bytes(), counts[static_cast<std::size_t>(call.index())], type,
                              recv.data(), counts.data(), displs.data(), type, call.comm()));
  recv.finish();
  return out;
}

}  // namespace meshtest::dist
