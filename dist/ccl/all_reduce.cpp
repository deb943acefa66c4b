// all_reduce: the shared-memory ring (one node) or MPI_Allreduce, out of place or in place;
// avg = sum / p.
#include "dist/ccl/all_reduce.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/shm.hpp"

namespace meshtest::dist {

namespace all_reduce_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_reduce bus_factor: {} devices; need at least 1", n);
  return 2.0 * (n - 1) / n;
}
}  // namespace all_reduce_bw

namespace {
// Reduces x into out; x and out are the same tensor for the in-place form.
void run(const MeshDevice& mesh, const Tensor& x, Tensor& out, const AllReduceOptions& opt,
         std::string_view name) {
  detail::Call call(name, mesh, opt.axis, x, {{.key = "op", .text = reduce_op_name(opt.op)}});
  call.agree({{"op", static_cast<std::int64_t>(opt.op), &detail::show_reduce_op}});
  const MPI_Op op = call.reduce_op(opt.op, x.dtype());
  call.perf().attr("op", reduce_op_name(opt.op)).output(out);
  const int count = call.count(x.numel(), "the tensor");
  if (count == 0) return;
  // No plan: the call needs nothing beyond the count, the MPI datatype and op. Through the
  // shared-memory group when there is one (on one node), else MPI_Allreduce.
  auto exchange = [in = x.bytes(), send = &x == &out ? MPI_IN_PLACE : x.bytes(), recv = out.bytes(),
                   count, t = detail::mpi_type(x.dtype()), dt = x.dtype(), op, rop = opt.op,
                   comm = call.comm(), shm = call.shm(), p = call.size()] {
    if (shm != nullptr) {
      shm->all_reduce(in, recv, count, dt, rop);
    } else {
      MESHTEST_MPI(MPI_Allreduce(send, recv, count, t, op, comm));
    }
    detail::finish_avg(recv, count, dt, rop, p);
  };
  exchange();
  call.trace(out, exchange);
}
}  // namespace

Tensor all_reduce(const MeshDevice& mesh, const Tensor& x, const AllReduceOptions& opt) {
  Tensor out(x.shape(), x.dtype(), Tensor::Uninitialized{});
  run(mesh, x, out, opt, "all_reduce");
  return out;
}

void all_reduce_inplace(const MeshDevice& mesh, Tensor& x, const AllReduceOptions& opt) {
  run(mesh, x, x, opt, "all_reduce_inplace");
}

}  // namespace meshtest::dist
