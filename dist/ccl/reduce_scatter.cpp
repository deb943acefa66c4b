// reduce_scatter: the shared-memory ring for equal blocks on one node (shm.hpp), else a direct
// point-to-point exchange of array_split blocks of `dim`, then a local reduction.
#include "dist/ccl/reduce_scatter.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/private_comm.hpp"
#include "dist/ccl/shm.hpp"

#include <algorithm>
#include <cstring>
#include <tuple>

namespace meshtest::dist {

namespace reduce_scatter_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "reduce_scatter bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace reduce_scatter_bw

namespace {
// Direct exchange, then a local reduction: every device sends block j of x straight to device
// j (MPI_Isend) and receives its own block from every other device (MPI_Irecv; the first,
// from device r+1, lands in the output itself), then reduces with MPI_Reduce_local in the
// fixed order x_{r+1}, x_r, x_{r+2}, ..., x_{r-1}. Each device sends (p-1)/p of x once — half
// of what MPI_Allreduce moves — in one step, while Open MPI 4.1's MPI_Reduce_scatter(_block)
// runs far below that on one node. Every op and dtype reduces through its MPI op (bf16 too).
// The messages go on a private duplicate of the axis communicator (detail::private_comm), so
// a receive the user posts on mesh.comm() (even MPI_ANY_SOURCE / MPI_ANY_TAG) never matches
// them.
struct Plan : perf::Plan {
  Shape out_shape;
  std::vector<int> counts;            // elements of block j (array_split along d)
  std::vector<std::size_t> offsets;   // byte offset of block j, blocks end to end
  detail::BlockLayout layout;         // blocks along d of x
  std::vector<std::byte> packed;      // x's blocks end to end (when not direct)
  std::vector<std::byte> received;    // blocks from devices r+2, ..., r-1 (p-2 of them)
  std::vector<MPI_Request> requests;  // 2(p-1)
  bool even = false;                  // every block has the same size
};

void exchange_and_reduce(Plan& pl, const std::byte* packed, std::byte* out, MPI_Datatype t,
                         MPI_Op op, MPI_Comm comm, int r, int p) {  // p >= 2
  const auto at = [&](int j) { return pl.offsets[static_cast<std::size_t>(j)]; };
  const int mine = pl.counts[static_cast<std::size_t>(r)];
  const std::size_t block_bytes = pl.received.size() / static_cast<std::size_t>(std::max(1, p - 2));
  auto* send = const_cast<std::byte*>(packed);  // read only: MPI's send buffers are void*
  MPI_Request* req = pl.requests.data();
  for (int k = 1; k < p; ++k) {
    const int from = (r + k) % p, to = (r - k + p) % p;
    std::byte* into =
        k == 1 ? out : pl.received.data() + static_cast<std::size_t>(k - 2) * block_bytes;
    MESHTEST_MPI(MPI_Irecv(into, mine, t, from, 0, comm, req++));
    MESHTEST_MPI(
        MPI_Isend(send + at(to), pl.counts[static_cast<std::size_t>(to)], t, to, 0, comm, req++));
  }
  MESHTEST_MPI(MPI_Waitall(2 * (p - 1), pl.requests.data(), MPI_STATUSES_IGNORE));
  if (mine == 0) return;
  MESHTEST_MPI(MPI_Reduce_local(send + at(r), out, mine, t, op));
  for (int k = 2; k < p; ++k) {
    MESHTEST_MPI(MPI_Reduce_local(
        pl.received.data() + static_cast<std::size_t>(k - 2) * block_bytes, out, mine, t, op));
  }
}
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
    std::vector<std::int64_t> sizes = split_sizes(x.shape()[d], call.size());
    pl->out_shape = x.shape().with(d, sizes[static_cast<std::size_t>(call.index())]);
    call.count(x.numel(), "the input");
    std::vector<int> displs;
    std::tie(pl->counts, displs) = call.counts(detail::block_elems(x.shape(), d, sizes), "a block");
    for (int e : displs) pl->offsets.push_back(static_cast<std::size_t>(e) * dtype_size(x.dtype()));
    pl->layout = detail::BlockLayout(x.shape(), x.dtype(), d, std::move(sizes));
    if (!pl->layout.direct()) pl->packed.resize(x.nbytes());
    const std::size_t mine =
        static_cast<std::size_t>(pl->out_shape.numel()) * dtype_size(x.dtype());
    pl->received.resize(mine * static_cast<std::size_t>(std::max(0, call.size() - 2)));
    pl->requests.resize(2 * static_cast<std::size_t>(call.size() - 1));
    pl->even = std::ranges::all_of(pl->counts, [&](int c) { return c == pl->counts[0]; });
    return pl;
  });
  Tensor out(plan->out_shape, x.dtype(), Tensor::Uninitialized{});
  call.perf().attr("dim", d).attr("op", reduce_op_name(opt.op)).output(out);
  if (x.empty()) return out;

  // Equal blocks go through the shared-memory group when there is one (packed first when the
  // dim is not leading).
  detail::ShmGroup* shm = plan->even ? call.shm() : nullptr;
  auto exchange = [pl = plan, in = x.bytes(), o = out.bytes(), n = out.numel(),
                   t = detail::mpi_type(x.dtype()), dt = x.dtype(), op, rop = opt.op,
                   comm = call.size() > 1 && shm == nullptr ? detail::private_comm(call.comm())
                                                            : MPI_COMM_NULL,
                   shm, r = call.index(), p = call.size()] {
    std::byte* packed = const_cast<std::byte*>(in);  // read only: MPI's send buffers are void*
    if (!pl->layout.direct()) {
      pl->layout.pack(in, pl->packed.data());
      packed = pl->packed.data();
    }
    if (shm != nullptr) {
      shm->reduce_scatter(packed, o, n, dt, rop);
    } else if (p == 1) {
      std::memcpy(o, packed, static_cast<std::size_t>(n) * dtype_size(dt));
    } else {
      exchange_and_reduce(*pl, packed, o, t, op, comm, r, p);
    }
    detail::finish_avg(o, n, dt, rop, p);
  };
  exchange();
  call.trace(out, exchange);
  return out;
}

}  // namespace meshtest::dist
