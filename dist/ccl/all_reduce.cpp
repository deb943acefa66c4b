// all_reduce: reduce-scatter then all-gather of the reduced parts, through the shared-memory
// group (one node) or MPI; out of place or in place. Every element is reduced in axis order by
// detail::reduce on one device, so every device and both paths get the same bits.
#include "dist/ccl/all_reduce.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/node_chain.hpp"
#include "dist/ccl/private_comm.hpp"
#include "dist/ccl/reduce.hpp"
#include "dist/ccl/shm.hpp"

namespace meshtest::dist {

namespace all_reduce_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_reduce bus_factor: {} devices; need at least 1", n);
  return 2.0 * (n - 1) / n;
}
}  // namespace all_reduce_bw

namespace {
// The MPI path: the flat tensor in array_split parts; device i reduces part i of every
// device's tensor (DirectReduceScatter), then MPI_Allgatherv spreads the reduced parts.
// Both halves move the bandwidth minimum, (p-1)/p of the tensor each way, and MPI's choice
// of algorithm can reorder no addition (MPI_Allreduce may).
struct AllReducePlan : perf::Plan {
  detail::DirectReduceScatter rs;
  std::vector<int> displs;  // elements
};

// Reduces x into out; x and out are the same tensor for the in-place form.
void run(const MeshDevice& mesh, const Tensor& x, Tensor& out, const AllReduceOptions& opt,
         std::string_view name) {
  detail::Call call(name, mesh, opt.axis, x, {{.key = "op", .text = reduce_op_name(opt.op)}});
  // Whether a group spanning nodes may take the node chain: agreed, as every device must
  // take the same path.
  const detail::NodeChain::Mode chain_mode = detail::NodeChain::mode();
  call.agree({{"op", static_cast<std::int64_t>(opt.op), &detail::show_reduce_op},
              {"node chain (MESHTEST_CCL_NODE_CHAIN)", static_cast<std::int64_t>(chain_mode),
               &detail::NodeChain::show_mode}});
  call.check_reduce_op(opt.op, x.dtype());
  call.perf().attr("op", reduce_op_name(opt.op)).output(out);
  const int count = call.count(x.numel(), "the tensor");
  if (count == 0) return;
  detail::ShmGroup* shm = call.shm();
  detail::NodeChain* chain = nullptr;
  if (shm == nullptr && chain_mode != detail::NodeChain::Mode::off && call.size() > 1) {
    chain = detail::NodeChain::establish(call.comm());  // collective the first time
    if (chain != nullptr && !chain->taken(chain_mode)) chain = nullptr;
  }
  if (chain != nullptr) {
    call.perf().attr("path", "node chain");
    auto exchange = [in = x.bytes(), out = out.bytes(), count, dt = x.dtype(), rop = opt.op,
                     chain] { chain->all_reduce(in, out, count, dt, rop); };
    exchange();
    call.trace(out, exchange);
    return;
  }
  std::shared_ptr<AllReducePlan> plan;
  if (shm == nullptr) {
    plan = call.plan<AllReducePlan>([&] {
      auto pl = std::make_shared<AllReducePlan>();
      auto [counts, displs] = call.counts(split_sizes(count, call.size()), "a part");
      pl->displs = std::move(displs);
      pl->rs = detail::DirectReduceScatter(std::move(counts), x.dtype(), call.index());
      return pl;
    });
  }
  auto exchange = [in = x.bytes(), out = out.bytes(), count, t = detail::mpi_type(x.dtype()),
                   dt = x.dtype(), rop = opt.op,
                   comm = shm == nullptr ? detail::private_comm(call.comm()) : MPI_COMM_NULL, shm,
                   pl = std::move(plan), r = static_cast<std::size_t>(call.index())] {
    if (shm != nullptr) {
      shm->all_reduce(in, out, count, dt, rop);
      return;
    }
    pl->rs.run(in, out + static_cast<std::size_t>(pl->displs[r]) * dtype_size(dt), t, rop, comm);
    MESHTEST_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, pl->rs.counts().data(),
                                pl->displs.data(), t, comm));
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
