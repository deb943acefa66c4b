// broadcast: the root's shape and dtype travel in the metadata, then a path moves the data
// (exchange.hpp).
#include "dist/ccl/broadcast.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/exchange.hpp"
#include "dist/ccl/front_end.hpp"

namespace meshtest::dist {

namespace broadcast_bw {
double bus_factor(int n) {
  MESHTEST_CHECK(n > 0, "broadcast bus_factor: {} devices; need at least 1", n);
  return 1.0;
}
}  // namespace broadcast_bw

void detail::broadcast(const MeshDevice& mesh, const CclArg& x, const BroadcastOptions& opt,
                       const MakeOutput& make_out) {
  Call call("broadcast", mesh, opt.axis, x, {{"root", opt.root}});
  if (opt.root < 0 || opt.root >= call.size()) {
    call.local_error("root {} out of range [0, {}) (the root is an index within the axis group)",
                     opt.root, call.size());
  }
  // Only the root's x counts: the others learn its shape and dtype from the metadata.
  call.agree({{"root", opt.root}}, {.tensors = false, .path = opt.path});
  const Meta& root = call.group()[static_cast<std::size_t>(opt.root)];
  const CclArg out = make_out(root.shape(), root.dtype_value());
  call.perf().attr("root", opt.root);
  call.output(out);
  if (out.empty()) return;
  exchange(call, &Path::broadcast,
           {.in = x.data, .out = out.data, .n = out.numel(), .t = out.dtype, .root = opt.root});
}

Tensor broadcast(const MeshDevice& mesh, const Tensor& x, const BroadcastOptions& opt) {
  Tensor out;
  detail::broadcast(mesh, host_arg(x), opt, host_output(out));
  return out;
}

}  // namespace meshtest::dist
