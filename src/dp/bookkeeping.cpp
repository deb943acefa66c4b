// Book-keeping clipped gradients through one Eigen GEMM per layer.
#include "src/dp/bookkeeping.hpp"

#include "src/dp/real.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dp {
namespace {

void check_coef(const char* op, const Tensor& coef, std::int64_t batch, DType dtype) {
  MESHTEST_CHECK(coef.shape() == Shape{batch} && coef.dtype() == dtype,
                 "{}: coef is {}, expected {}[{}]", op, describe(coef), dtype, batch);
}

}  // namespace

Tensor clipped_weight_grad(const Tensor& a, Tensor g, const Tensor& coef) {
  perf::OpScope scope("bk_weight_grad");
  scope.input(a).input(g).input(coef);
  check_same_samples("clipped_weight_grad", a, g);
  const SeqDims da = seq_dims(a, "clipped_weight_grad", "a");
  const SeqDims dg = seq_dims(g, "clipped_weight_grad", "g");
  check_coef("clipped_weight_grad", coef, da.batch, a.dtype());
  Tensor w(Shape{dg.features, da.features}, a.dtype());
  visit_real(a.dtype(), "clipped_weight_grad", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> am(a.data<S>(), da.batch * da.seq, da.features);
    Eigen::Map<RowMatrix<S>> gs(g.data<S>(), dg.batch * dg.seq, dg.features);
    for (std::int64_t i = 0; i < dg.batch; ++i)
      gs.middleRows(i * dg.seq, dg.seq) *= coef.data<S>()[i];
    w.matrix<S>().noalias() = gs.transpose() * am;
  });
  scope.flops(2.0 * static_cast<double>(da.batch * da.seq * da.features * dg.features)).output(w);
  return w;
}

Tensor clipped_bias_grad(const Tensor& g, const Tensor& coef) {
  return clipped_sum(per_sample_bias_grads(g), coef);
}

Tensor clipped_sum(const Tensor& per_sample, const Tensor& coef) {
  perf::OpScope scope("clipped_sum");
  scope.input(per_sample).input(coef);
  MESHTEST_CHECK(per_sample.rank() >= 1, "clipped_sum: per-sample grads have shape {}",
                 per_sample.shape());
  const std::int64_t batch = per_sample.shape()[0];
  check_coef("clipped_sum", coef, batch, per_sample.dtype());
  std::vector<std::int64_t> dims = per_sample.shape().vec();
  dims.erase(dims.begin());
  Tensor out{Shape(dims), per_sample.dtype()};
  visit_real(per_sample.dtype(), "clipped_sum", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> ps(per_sample.data<S>(), batch, out.numel());
    out.vector<S>().noalias() = ps.transpose() * coef.vector<S>();
  });
  scope.output(out);
  return out;
}

Tensor per_sample_weight_grads(const Tensor& a, const Tensor& g) {
  perf::OpScope scope("per_sample_weight_grads");
  scope.input(a).input(g);
  check_same_samples("per_sample_weight_grads", a, g);
  const SeqDims da = seq_dims(a, "per_sample_weight_grads", "a");
  const SeqDims dg = seq_dims(g, "per_sample_weight_grads", "g");
  Tensor out(Shape{da.batch, dg.features, da.features}, a.dtype());
  visit_real(a.dtype(), "per_sample_weight_grads", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> am(a.data<S>(), da.batch * da.seq, da.features);
    const Eigen::Map<const RowMatrix<S>> gm(g.data<S>(), dg.batch * dg.seq, dg.features);
    for (std::int64_t i = 0; i < da.batch; ++i) {
      Eigen::Map<RowMatrix<S>>(out.data<S>() + i * dg.features * da.features, dg.features,
                               da.features)
          .noalias() =
          gm.middleRows(i * da.seq, da.seq).transpose() * am.middleRows(i * da.seq, da.seq);
    }
  });
  scope.flops(2.0 * static_cast<double>(da.batch * da.seq * da.features * dg.features)).output(out);
  return out;
}

Tensor per_sample_bias_grads(const Tensor& g) {
  const SeqDims d = seq_dims(g, "per_sample_bias_grads", "g");
  Tensor out(Shape{d.batch, d.features}, g.dtype());
  visit_real(g.dtype(), "per_sample_bias_grads", [&]<class S>(type_tag<S>) {
    const Eigen::Map<const RowMatrix<S>> gm(g.data<S>(), d.batch * d.seq, d.features);
    for (std::int64_t i = 0; i < d.batch; ++i) {
      out.matrix<S>().row(i) = gm.middleRows(i * d.seq, d.seq).colwise().sum();
    }
  });
  return out;
}

Tensor per_sample_norm_sq(const Tensor& per_sample) {
  MESHTEST_CHECK(per_sample.rank() >= 1, "per_sample_norm_sq: shape {}", per_sample.shape());
  const std::int64_t batch = per_sample.shape()[0];
  Tensor out(Shape{batch}, per_sample.dtype());
  visit_real(per_sample.dtype(), "per_sample_norm_sq", [&]<class S>(type_tag<S>) {
    const std::int64_t n = batch == 0 ? 0 : per_sample.numel() / batch;
    const Eigen::Map<const RowMatrix<S>> ps(per_sample.data<S>(), batch, n);
    out.vector<S>() = ps.rowwise().squaredNorm();
  });
  return out;
}

}  // namespace meshtest::dp
