// sdpa: per-head Eigen GEMMs, masks and the sink softmax.
#include "src/ops/sdpa.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/ops/attention_mask.hpp"
#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::round_all;

// Softmax of row `i` of `logits` over its visible keys plus the sink, in place; masked keys
// get weight 0.
template <class C>
void sink_softmax_row(RowMatrix<C>& logits, Eigen::Index i, C sink, const SdpaOptions& o) {
  const std::int64_t q_pos = o.q_offset + i;
  const MaskSpec mask{.causal = true, .sliding_window = o.sliding_window};
  const auto visible = [&](Eigen::Index j) { return key_visible(q_pos, o.k_offset + j, mask); };
  C max = sink;
  for (Eigen::Index j = 0; j < logits.cols(); ++j) {
    if (visible(j)) max = std::max(max, logits(i, j));
  }
  if (max == -std::numeric_limits<C>::infinity()) {
    logits.row(i).setZero();
    return;
  }
  C denom = std::exp(sink - max);
  for (Eigen::Index j = 0; j < logits.cols(); ++j) {
    const C e = visible(j) ? std::exp(logits(i, j) - max) : C(0);
    logits(i, j) = e;
    denom += e;
  }
  logits.row(i) /= denom;
}

template <class S>
Tensor sdpa_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                 const SdpaOptions& o) {
  using C = compute_t<S>;
  const Eigen::Index tq = q.shape()[0];
  const Eigen::Index kv_heads = q.shape()[1];
  const Eigen::Index q_per_kv = q.shape()[2];
  const Eigen::Index d = q.shape()[3];
  const Eigen::Index tk = k.shape()[0];
  const Eigen::Index heads = kv_heads * q_per_kv;
  const C scale = static_cast<C>(o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d))));

  const detail::ComputeMatrix<S> qm(q, 0, tq, heads * d);
  const detail::ComputeMatrix<S> km(k, 0, tk, kv_heads * d);
  const detail::ComputeMatrix<S> vm(v, 0, tk, kv_heads * d);
  const detail::ComputeMatrix<S> sm(sinks, 0, 1, heads);
  RowMatrix<C> out(tq, heads * d);
  RowMatrix<C> logits(tq, tk);
  for (Eigen::Index h = 0; h < heads; ++h) {
    const Eigen::Index g = h / q_per_kv;
    const detail::StridedRowMap<C> qh(qm.map().data() + h * d, tq, d,
                                      Eigen::OuterStride<>(heads * d));
    const detail::StridedRowMap<C> kg(km.map().data() + g * d, tk, d,
                                      Eigen::OuterStride<>(kv_heads * d));
    const detail::StridedRowMap<C> vg(vm.map().data() + g * d, tk, d,
                                      Eigen::OuterStride<>(kv_heads * d));
    logits.noalias() = qh * kg.transpose();
    round_all<S>(logits);
    logits *= scale;
    round_all<S>(logits);
    for (Eigen::Index i = 0; i < tq; ++i) sink_softmax_row<C>(logits, i, sm.map()(0, h), o);
    round_all<S>(logits);
    out.middleCols(h * d, d).noalias() = logits * vg;
  }
  round_all<S>(out);
  return detail::to_tensor<S>(out, Shape{tq, heads * d});
}

}  // namespace

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
            const SdpaOptions& options) {
  constexpr std::string_view op = "sdpa";
  perf::OpScope scope(op);
  scope.input(q).input(k).input(v).input(sinks);
  scope.attr("window", options.sliding_window)
      .attr("q_offset", options.q_offset)
      .attr("k_offset", options.k_offset);
  check_sdpa_args(op, q, k, v, sinks, options);
  Tensor out = detail::visit_floating(
      q.dtype(), op, [&]<class S>(type_tag<S>) { return sdpa_impl<S>(q, k, v, sinks, options); });
  // q·k and weights·v: 2 GEMMs of Tq x Tk x d per head (masked entries included).
  scope.output(out).flops(4.0 * static_cast<double>(q.numel()) * static_cast<double>(k.shape()[0]));
  return out;
}

void check_sdpa_args(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& sinks, const SdpaOptions& options) {
  detail::check_rank(op, "q ([Tq, kv_heads, q_per_kv, head_dim])", q, 4);
  detail::check_rank(op, "k ([Tk, kv_heads, head_dim])", k, 3);
  const std::int64_t kv_heads = q.shape()[1];
  const std::int64_t d = q.shape()[3];
  MESHTEST_CHECK(d > 0, "{}: q has shape {}, head_dim must be > 0", op, q.shape());
  detail::check_shape(op, "k", k, Shape{k.shape()[0], kv_heads, d});
  detail::check_shape(op, "v", v, k.shape());
  detail::check_shape(op, "sinks", sinks, Shape{kv_heads * q.shape()[2]});
  detail::check_dtype(op, "k", k, q.dtype());
  detail::check_dtype(op, "v", v, q.dtype());
  detail::check_dtype(op, "sinks", sinks, q.dtype());
  MESHTEST_CHECK(options.sliding_window >= 0, "{}: sliding_window is {}, expected >= 0", op,
                 options.sliding_window);
  MESHTEST_CHECK(!options.scale || std::isfinite(*options.scale),
                 "{}: scale is {}, expected a finite value", op, options.scale.value_or(0.0));
}

}  // namespace meshtest
