// all_gather: each device's piece, placed along `dim` in axis order: through the shared-memory
// group for equal pieces, else MPI_Allgather(v); pieces along a dim that is not leading are
// gathered end to end and unpacked.
#include "dist/ccl/all_gather.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/shm.hpp"

#include <tuple>

namespace meshtest::dist {

namespace all_gather_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_gather bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace all_gather_bw

namespace {
// What every call of one signature shares: the output shape, the MPI counts and the layout.
struct AllGatherPlan : perf::Plan {
  Shape out_shape;
  std::vector<int> counts, displs;
  bool even = false;                 // every piece has the same size: MPI_Allgather
  detail::BlockLayout layout;        // pieces along d of the output
  std::vector<std::byte> workspace;  // pieces end to end, when d is not leading
};
}  // namespace

Tensor all_gather(const MeshDevice& mesh, const Tensor& x, const AllGatherOptions& opt) {
  detail::Call call("all_gather", mesh, opt.axis, x, {{"dim", opt.dim}});
  const int d = call.dim("dim", opt.dim);
  call.agree({{"dim", opt.dim}}, {.free_dim = d});
  const auto plan = call.plan<AllGatherPlan>([&] {
    // Device i contributes n_i along d (any sizes, e.g. array_split shards).
    auto pl = std::make_shared<AllGatherPlan>();
    std::vector<std::int64_t> sizes;
    std::int64_t n = 0;
    for (const detail::Meta& m : call.group()) {
      sizes.push_back(m.dims[static_cast<std::size_t>(d)]);
      n += sizes.back();
    }
    pl->out_shape = x.shape().with(d, n);
    call.count(pl->out_shape.numel(), "the gathered output");
    std::tie(pl->counts, pl->displs) =
        call.counts(detail::block_elems(x.shape(), d, sizes), "a piece");
    pl->even = call.uniform();
    pl->layout = detail::BlockLayout(pl->out_shape, x.dtype(), d, std::move(sizes));
    if (!pl->layout.direct()) {
      pl->workspace.resize(pl->out_shape.numel() * dtype_size(x.dtype()));
    }
    return pl;
  });
  Tensor out(plan->out_shape, x.dtype(), Tensor::Uninitialized{});
  call.perf().attr("dim", d).output(out);
  if (out.empty()) return out;

  // Equal pieces go through the shared-memory group when there is one. Otherwise pieces along
  // a dim that is not leading are gathered end to end and unpacked: MPI only ever sees
  // contiguous buffers of its basic types, never a derived type of interleaved pieces (see
  // all_to_all.cpp).
  detail::ShmGroup* shm = plan->even ? call.shm() : nullptr;
  auto exchange = [pl = plan, in = x.bytes(), o = out.bytes(), t = detail::mpi_type(x.dtype()),
                   me = static_cast<std::size_t>(call.index()), comm = call.comm(), shm,
                   bytes = x.nbytes()] {
    if (shm != nullptr) {  // unpacked straight from the slots
      shm->all_gather(in, pl->layout, o, bytes);
      return;
    }
    std::byte* recv = pl->layout.direct() ? o : pl->workspace.data();
    if (pl->even) {
      MESHTEST_MPI(MPI_Allgather(in, pl->counts[me], t, recv, pl->counts[me], t, comm));
    } else {
      MESHTEST_MPI(MPI_Allgatherv(in, pl->counts[me], t, recv, pl->counts.data(), pl->displs.data(),
                                  t, comm));
    }
    if (!pl->layout.direct()) pl->layout.unpack(recv, o);
  };
  exchange();
  call.trace(out, exchange);
  return out;
}

}  // namespace meshtest::dist
