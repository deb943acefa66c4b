// mse and cross-entropy per-sample losses and gradients through Eigen arrays.
#include "src/dp/loss.hpp"

#include <cmath>

#include "src/ops/visit_real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dp {
namespace {

std::int64_t class_at(const Tensor& target, std::int64_t r) {
  return target.dtype() == DType::i64 ? target.data<std::int64_t>()[r]
                                      : target.data<std::int32_t>()[r];
}

}  // namespace

LossKind loss_from_name(std::string_view name) {
  if (name == "mse") return LossKind::mse;
  if (name == "ce") return LossKind::ce;
  fail("unknown loss '{}' (expected mse or ce)", name);
}

Reduction reduction_from_name(std::string_view name) {
  if (name == "mean") return Reduction::mean;
  if (name == "sum") return Reduction::sum;
  fail("unknown loss reduction '{}' (expected mean or sum)", name);
}

std::string_view loss_name(LossKind k) { return k == LossKind::mse ? "mse" : "ce"; }
std::string_view reduction_name(Reduction r) { return r == Reduction::mean ? "mean" : "sum"; }

LossOutput loss_and_grad(const Tensor& out, const Tensor& target, LossKind kind,
                         Reduction reduction, std::int64_t divisor) {
  perf::OpScope scope(kind == LossKind::mse ? "mse_loss" : "cross_entropy_loss");
  scope.input(out).input(target);
  MESHTEST_CHECK(out.rank() == 2 || out.rank() == 3,
                 "loss: output has shape {}, expected [B, d] or [B, T, d]", out.shape());
  const std::int64_t batch = out.shape()[0];
  const std::int64_t feat = out.shape()[out.rank() - 1];
  const std::int64_t rows = out.shape().outer(out.rank() - 1);
  const std::int64_t seq = batch == 0 ? 1 : rows / batch;
  if (kind == LossKind::mse) {
    MESHTEST_CHECK(target.shape() == out.shape() && target.dtype() == out.dtype(),
                   "mse loss: targets are {} but the output is {} (expected the same)",
                   describe(target), describe(out));
  } else {
    const Shape want = out.rank() == 2 ? Shape{batch} : Shape{batch, out.shape()[1]};
    MESHTEST_CHECK(
        target.shape() == want && (target.dtype() == DType::i64 || target.dtype() == DType::i32),
        "ce loss: targets are {} for output {}, expected i64 or i32 classes of shape {}",
        describe(target), out.shape(), want);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t k = class_at(target, r);
      MESHTEST_CHECK(k >= 0 && k < feat, "ce loss: target {} at row {} is outside [0, {})", k, r,
                     feat);
    }
  }
  if (divisor < 0) divisor = batch;
  const double scale = reduction == Reduction::mean
                           ? 1.0 / static_cast<double>(std::max<std::int64_t>(divisor, 1))
                           : 1.0;
  LossOutput res{.per_sample = Tensor(Shape{batch}, out.dtype()),
                 .grad = Tensor(out.shape(), out.dtype())};
  visit_real(out.dtype(), "loss", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> o(out.data<S>(), rows, feat);
    Eigen::Map<RowMatrix<S>> g(res.grad.data<S>(), rows, feat);
    Eigen::Matrix<S, Eigen::Dynamic, 1> row_loss(rows);
    if (kind == LossKind::mse) {
      const Eigen::Map<const RowMatrix<S>> y(target.data<S>(), rows, feat);
      g = o - y;
      row_loss = g.rowwise().squaredNorm();
      g *= static_cast<S>(2 * scale);
    } else {
      for (std::int64_t r = 0; r < rows; ++r) {
        const S m = o.row(r).maxCoeff();
        const auto e = (o.row(r).array() - m).exp();
        const S z = e.sum();
        const std::int64_t k = class_at(target, r);
        row_loss[r] = std::log(z) + m - o(r, k);
        g.row(r) = (e / z).matrix() * static_cast<S>(scale);
        g(r, k) -= static_cast<S>(scale);
      }
    }
    for (std::int64_t i = 0; i < batch; ++i) {
      res.per_sample.data<S>()[i] = row_loss.segment(i * seq, seq).sum();
    }
    res.total = static_cast<double>(res.per_sample.vector<S>().sum()) * scale;
  });
  scope.output(res.grad);
  return res;
}

}  // namespace meshtest::dp
