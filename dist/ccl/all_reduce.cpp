// all_reduce: every element reduced in axis order by detail::reduce on one device and spread to
// the others, through the path that takes it (exchange.hpp); out of place or in place.
#include "dist/ccl/all_reduce.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/exchange.hpp"
#include "dist/ccl/front_end.hpp"
#include "dist/ccl/numerics.hpp"

namespace meshtest::dist {

namespace all_reduce_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "all_reduce bus_factor: {} devices; need at least 1", n);
  return 2.0 * (n - 1) / n;
}
}  // namespace all_reduce_bw

void detail::all_reduce(const MeshDevice& mesh, const CclArg& x, const CclArg& out,
                        const AllReduceOptions& opt, bool in_place) {
  Call call(in_place ? "all_reduce_inplace" : "all_reduce", mesh, opt.axis, x,
            {{.key = "op", .text = reduce_op_name(opt.op)}});
  const AgreedOption numerics = numerics_option(call, opt.numerics);
  call.agree({{"op", static_cast<std::int64_t>(opt.op), &show_reduce_op}, numerics},
             {.out = &out, .path = opt.path});
  call.check_reduce_op(opt.op, x.dtype);
  call.perf().attr("op", reduce_op_name(opt.op));
  call.output(out);
  if (x.empty()) return;
  exchange(call, &Path::all_reduce,
           {.in = x.data,
            .out = out.data,
            .n = x.numel(),
            .t = x.dtype,
            .op = opt.op,
            .numerics = static_cast<Numerics>(numerics.value)});
}

Tensor all_reduce(const MeshDevice& mesh, const Tensor& x, const AllReduceOptions& opt) {
  Tensor out(x.shape(), x.dtype(), Tensor::Uninitialized{});
  detail::all_reduce(mesh, host_arg(x), host_arg(out), opt, false);
  return out;
}

void all_reduce_inplace(const MeshDevice& mesh, Tensor& x, const AllReduceOptions& opt) {
  const CclArg arg = host_arg(x);
  detail::all_reduce(mesh, arg, arg, opt, true);
}

}  // namespace meshtest::dist
