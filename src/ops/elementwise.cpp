// Element-wise ops: add.
#include "src/ops/elementwise.hpp"

#include "src/ops/compute.hpp"

namespace meshtest {

Tensor add(const Tensor& a, const Tensor& b) {
  detail::check_shape("add", "b", b, a.shape());
  detail::check_dtype("add", "b", b, a.dtype());
  return detail::visit_floating(a.dtype(), "add", [&]<class S>(type_tag<S>) {
    using C = detail::compute_t<S>;
    const detail::ComputeMatrix<S> am(a, 0, 1, a.numel());
    const detail::ComputeMatrix<S> bm(b, 0, 1, b.numel());
    const RowMatrix<C> sum = am.map() + bm.map();
    return detail::to_tensor<S>(sum, a.shape());
  });
}

}  // namespace meshtest
