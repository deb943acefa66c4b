// reduce_scatter: array_split blocks of `dim`, block j of every device reduced in axis order on
// device j. The front end agrees and plans the blocks; a path moves and reduces them
// (exchange.hpp).
#include "dist/ccl/reduce_scatter.hpp"

#include <algorithm>

#include "dist/ccl/detail.hpp"
#include "dist/ccl/exchange.hpp"
#include "dist/ccl/front_end.hpp"
#include "dist/ccl/numerics.hpp"

namespace meshtest::dist {

namespace reduce_scatter_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "reduce_scatter bus_factor: {} devices; need at least 1", n);
  return static_cast<double>(n - 1) / n;
}
}  // namespace reduce_scatter_bw

void detail::reduce_scatter(const MeshDevice& mesh, const CclArg& x,
                            const ReduceScatterOptions& opt, const MakeOutput& make_out) {
  Call call("reduce_scatter", mesh, opt.axis, x,
            {{"dim", opt.dim}, {.key = "op", .text = reduce_op_name(opt.op)}});
  const int d = call.dim("dim", opt.dim);
  const AgreedOption numerics = numerics_option(call, opt.numerics);
  call.agree(
      {{"dim", opt.dim}, {"op", static_cast<std::int64_t>(opt.op), &show_reduce_op}, numerics},
      {.path = opt.path});
  call.check_reduce_op(opt.op, x.dtype);
  const auto plan = call.plan<BlockPlan>([&] {
    // Device i keeps split_range(n, p, i) along d.
    auto pl = std::make_shared<BlockPlan>();
    std::vector<std::int64_t> sizes = split_sizes(x.shape[d], call.size());
    pl->out_shape = x.shape.with(d, sizes[static_cast<std::size_t>(call.index())]);
    pl->elems = block_elems(x.shape, d, sizes);
    pl->even = std::ranges::all_of(pl->elems, [&](std::int64_t e) { return e == pl->elems[0]; });
    pl->layout = BlockLayout(x.shape, x.dtype, d, std::move(sizes));
    return pl;
  });
  const CclArg out = make_out(plan->out_shape, x.dtype);
  call.perf().attr("dim", d).attr("op", reduce_op_name(opt.op));
  call.output(out);
  if (x.empty()) return;
  exchange(call, &Path::reduce_scatter,
           {.in = x.data,
            .out = out.data,
            .t = x.dtype,
            .op = opt.op,
            .numerics = static_cast<Numerics>(numerics.value),
            .plan = plan});
}

Tensor reduce_scatter(const MeshDevice& mesh, const Tensor& x, const ReduceScatterOptions& opt) {
  Tensor out;
  detail::reduce_scatter(mesh, host_arg(x), opt, host_output(out));
  return out;
}

}  // namespace meshtest::dist
