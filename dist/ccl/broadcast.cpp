// broadcast: the root's shape and dtype travel in the metadata, then MPI_Bcast of the data.
#include "dist/ccl/broadcast.hpp"

#include "dist/ccl/detail.hpp"

namespace meshtest::dist {

namespace broadcast_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "broadcast bus_factor: {} devices; need at least 1", n);
  return 1.0;
}
}  // namespace broadcast_bw

Tensor broadcast(const MeshDevice& mesh, const Tensor& x, const BroadcastOptions& opt) {
  detail::Call call("broadcast", mesh, opt.axis, x, {{"root", opt.root}});
  if (opt.root < 0 || opt.root >= call.size()) {
    call.local_error("root {} out of range [0, {}) (the root is an index within the axis group)",
                     opt.root, call.size());
  }
  // Only the root's x counts: the others learn its shape and dtype from the metadata.
  call.agree({{"root", opt.root}}, {.tensors = false});
  const detail::Meta& root = call.group()[static_cast<std::size_t>(opt.root)];
  Tensor out = call.index() == opt.root ? x : Tensor(root.shape(), root.dtype_value());
  call.perf().attr("root", opt.root).output(out);
  const int count = call.count(out.numel(), "the root's tensor");
  if (count == 0) return out;
  MESHTEST_MPI(MPI_Bcast(out.bytes(), count, detail::mpi_type(out.dtype()), opt.root, call.comm()));
  return out;
}

}  // namespace meshtest::dist
