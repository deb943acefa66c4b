// SGD and Adam updates through Eigen arrays.
#include "src/dp/optimizer.hpp"

#include <cmath>

#include "src/dp/real.hpp"

namespace meshtest::dp {

OptimizerKind optimizer_from_name(std::string_view name) {
  if (name == "sgd") return OptimizerKind::sgd;
  if (name == "adam") return OptimizerKind::adam;
  fail("unknown optimizer '{}' (expected sgd or adam)", name);
}

Optimizer::Optimizer(OptimizerOptions opt) : opt_(opt) {
  MESHTEST_CHECK(std::isfinite(opt.lr) && opt.lr >= 0 && opt.beta1 >= 0 && opt.beta1 < 1 &&
                     opt.beta2 >= 0 && opt.beta2 < 1 && opt.eps > 0,
                 "optimizer: lr {} (>= 0), beta1 {}, beta2 {} (in [0, 1)) or eps {} (> 0) out "
                 "of range",
                 opt.lr, opt.beta1, opt.beta2, opt.eps);
}

void Optimizer::update(std::size_t slot, Tensor& value, const Tensor& grad) {
  MESHTEST_CHECK(value.shape() == grad.shape() && value.dtype() == grad.dtype(),
                 "optimizer: value {} and grad {} differ", describe(value), describe(grad));
  MESHTEST_CHECK(step_ >= 1, "optimizer: call next_step() before update()");
  visit_real(value.dtype(), "optimizer", [&]<class S>(type_tag<S>) {
    auto w = value.vector<S>().array();
    const auto g = grad.vector<S>().array();
    const S lr = static_cast<S>(opt_.lr);
    if (opt_.kind == OptimizerKind::sgd) {
      w -= lr * g;
      return;
    }
    if (m_.size() <= slot) {
      m_.resize(slot + 1);
      v_.resize(slot + 1);
    }
    if (is_unset(m_[slot])) {
      m_[slot] = Tensor(value.shape(), value.dtype());
      v_[slot] = Tensor(value.shape(), value.dtype());
    }
    auto m = m_[slot].vector<S>().array();
    auto v = v_[slot].vector<S>().array();
    const S b1 = static_cast<S>(opt_.beta1), b2 = static_cast<S>(opt_.beta2);
    m = b1 * m + (S(1) - b1) * g;
    v = b2 * v + (S(1) - b2) * g * g;
    const S c1 = S(1) - static_cast<S>(std::pow(opt_.beta1, static_cast<double>(step_)));
    const S c2 = S(1) - static_cast<S>(std::pow(opt_.beta2, static_cast<double>(step_)));
    w -= lr * (m / c1) / ((v / c2).sqrt() + static_cast<S>(opt_.eps));
  });
}

}  // namespace meshtest::dp
