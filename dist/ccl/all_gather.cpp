// all_gather: each device's piece, placed along `dim` in axis order. The front end agrees and
// plans the pieces; a path moves them (exchange.hpp).
#include "dist/ccl/all_gather.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/exchange.hpp"
#include "dist/ccl/front_end.hpp"

namespace meshtest::dist {

namespace all_gather_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_gather bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace all_gather_bw

void detail::all_gather(const MeshDevice& mesh, const CclArg& x, const AllGatherOptions& opt,
                        const MakeOutput& make_out) {
  Call call("all_gather", mesh, opt.axis, x, {{"dim", opt.dim}});
  const int d = call.dim("dim", opt.dim);
  call.agree({{"dim", opt.dim}}, {.free_dim = d, .path = opt.path});
  const auto plan = call.plan<BlockPlan>([&] {
    // Device i contributes n_i along d (any sizes, e.g. array_split shards).
    auto pl = std::make_shared<BlockPlan>();
    std::vector<std::int64_t> sizes;
    std::int64_t n = 0;
    for (const Meta& m : call.group()) {
      sizes.push_back(m.dims[static_cast<std::size_t>(d)]);
      n += sizes.back();
    }
    pl->out_shape = x.shape.with(d, n);
    pl->elems = block_elems(x.shape, d, sizes);
    pl->even = call.uniform();
    pl->layout = BlockLayout(pl->out_shape, x.dtype, d, std::move(sizes));
    return pl;
  });
  const CclArg out = make_out(plan->out_shape, x.dtype);
  call.perf().attr("dim", d);
  call.output(out);
  if (out.empty()) return;
  exchange(call, &Path::all_gather, {.in = x.data, .out = out.data, .t = x.dtype, .plan = plan});
}

Tensor all_gather(const MeshDevice& mesh, const Tensor& x, const AllGatherOptions& opt) {
  Tensor out;
  detail::all_gather(mesh, host_arg(x), opt, host_output(out));
  return out;
}

}  // namespace meshtest::dist
