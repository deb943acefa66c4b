// rope: YaRN frequencies, cos/sin tables and the half-split rotation.
#include "src/ops/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

void check_params(const RopeParams& p) {
  MESHTEST_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0,
                 "rope: head_dim is {}, expected a positive even number", p.head_dim);
  MESHTEST_CHECK(std::isfinite(p.theta) && p.theta > 1.0, "rope: theta is {}, expected > 1",
                 p.theta);
  MESHTEST_CHECK(std::isfinite(p.scaling_factor) && p.scaling_factor > 0,
                 "rope: scaling_factor is {}, expected > 0", p.scaling_factor);
  MESHTEST_CHECK(p.initial_context_length > 0, "rope: initial_context_length is {}, expected > 0",
                 p.initial_context_length);
  MESHTEST_CHECK(p.ntk_alpha > 0 && p.ntk_beta > 0,
                 "rope: ntk_alpha {} and ntk_beta {} must both be > 0", p.ntk_alpha, p.ntk_beta);
}

template <class C>
YarnFrequencies yarn_impl(const RopeParams& p) {
  const std::int64_t half = p.head_dim / 2;
  YarnFrequencies f;
  f.inv_freq.resize(static_cast<std::size_t>(half));
  std::vector<C> freq(f.inv_freq.size());
  for (std::int64_t j = 0; j < half; ++j) {
    const C exponent = static_cast<C>(2 * j) / static_cast<C>(p.head_dim);
    freq[j] = std::pow(static_cast<C>(p.theta), exponent);
  }
  if (p.scaling_factor <= 1.0) {
    for (std::int64_t j = 0; j < half; ++j) f.inv_freq[j] = C(1) / freq[j];
    return f;
  }
  const double d_half = static_cast<double>(half);
  const double two_pi = 2.0 * std::numbers::pi;
  const double ctx = static_cast<double>(p.initial_context_length);
  f.concentration = 0.1 * std::log(p.scaling_factor) + 1.0;
  f.low = d_half * std::log(ctx / (p.ntk_beta * two_pi)) / std::log(p.theta);
  f.high = d_half * std::log(ctx / (p.ntk_alpha * two_pi)) / std::log(p.theta);
  MESHTEST_CHECK(0 < f.low && f.low < f.high && f.high < d_half - 1,
                 "rope: YaRN needs 0 < low < high < head_dim/2 - 1, got low = {}, high = {}, "
                 "head_dim/2 - 1 = {} (head_dim {}, theta {}, initial_context_length {}, "
                 "ntk_alpha {}, ntk_beta {})",
                 f.low, f.high, d_half - 1, p.head_dim, p.theta, p.initial_context_length,
                 p.ntk_alpha, p.ntk_beta);
  const C s = static_cast<C>(p.scaling_factor);
  const C low = static_cast<C>(f.low);
  const C width = static_cast<C>(f.high - f.low);
  for (std::int64_t j = 0; j < half; ++j) {
    const C interpolation = C(1) / (s * freq[j]);
    const C extrapolation = C(1) / freq[j];
    const C ramp = std::clamp((static_cast<C>(j) - low) / width, C(0), C(1));
    const C mask = C(1) - ramp;
    f.inv_freq[j] = interpolation * (C(1) - mask) + extrapolation * mask;
  }
  return f;
}

template <class S>
RopeTable table_impl(const RopeParams& p, std::int64_t num_tokens, std::int64_t offset) {
  using C = detail::compute_t<S>;
  const YarnFrequencies f = yarn_frequencies(p, dtype_of<S>());
  const std::int64_t half = p.head_dim / 2;
  RowMatrix<C> cos(num_tokens, half);
  RowMatrix<C> sin(num_tokens, half);
  const C concentration = static_cast<C>(f.concentration);
  for (std::int64_t i = 0; i < num_tokens; ++i) {
    const C pos = static_cast<C>(offset + i);
    for (std::int64_t j = 0; j < half; ++j) {
      const C angle = pos * static_cast<C>(f.inv_freq[j]);
      cos(i, j) = std::cos(angle) * concentration;
      sin(i, j) = std::sin(angle) * concentration;
    }
  }
  const Shape shape{num_tokens, half};
  return {detail::to_tensor<S>(cos, shape), detail::to_tensor<S>(sin, shape)};
}

template <class S>
Tensor apply_impl(const Tensor& x, const RopeTable& table) {
  using C = detail::compute_t<S>;
  const auto r = [](C v) { return detail::round_as<S>(v); };
  const std::int64_t tokens = x.shape()[0];
  const std::int64_t half = table.cos.shape()[1];
  const std::int64_t heads = tokens == 0 ? 0 : x.numel() / (tokens * 2 * half);
  const detail::ComputeMatrix<S> xm(x, 0, tokens * heads, 2 * half);
  const detail::ComputeMatrix<S> cm(table.cos);
  const detail::ComputeMatrix<S> sm(table.sin);
  RowMatrix<C> out(tokens * heads, 2 * half);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const auto in = xm.map().row(t * heads + h);
      auto o = out.row(t * heads + h);
      for (std::int64_t j = 0; j < half; ++j) {
        const C c = cm.map()(t, j);
        const C s = sm.map()(t, j);
        const C x1 = in(j);
        const C x2 = in(half + j);
        o(j) = r(r(x1 * c) - r(x2 * s));
        o(half + j) = r(r(x2 * c) + r(x1 * s));
      }
    }
  }
  return detail::to_tensor<S>(out, x.shape());
}

}  // namespace

YarnFrequencies yarn_frequencies(const RopeParams& p, DType dtype) {
  check_params(p);
  return detail::visit_floating(dtype, "yarn_frequencies", [&]<class S>(type_tag<S>) {
    return yarn_impl<detail::compute_t<S>>(p);
  });
}

RopeTable rope_table(const RopeParams& p, std::int64_t num_tokens, std::int64_t position_offset,
                     DType dtype) {
  MESHTEST_CHECK(num_tokens >= 0 && position_offset >= 0,
                 "rope_table: num_tokens {} and position_offset {} must be >= 0", num_tokens,
                 position_offset);
  perf::OpScope scope("rope_table");
  scope.attr("tokens", num_tokens).attr("offset", position_offset).attr("head_dim", p.head_dim);
  RopeTable t = detail::visit_floating(dtype, "rope_table", [&]<class S>(type_tag<S>) {
    return table_impl<S>(p, num_tokens, position_offset);
  });
  scope.output(t.cos).output(t.sin).flops(4.0 * static_cast<double>(t.cos.numel()));
  return t;
}

Tensor apply_rope(const Tensor& x, const RopeTable& table) {
  constexpr std::string_view op = "apply_rope";
  perf::OpScope scope(op);
  scope.input(x).input(table.cos).input(table.sin);
  detail::check_rank(op, "table.cos", table.cos, 2);
  detail::check_shape(op, "table.sin", table.sin, table.cos.shape());
  detail::check_dtype(op, "table.sin", table.sin, table.cos.dtype());
  const std::int64_t half = table.cos.shape()[1];
  MESHTEST_CHECK(
      x.rank() >= 2 && x.shape()[0] == table.cos.shape()[0] && x.shape()[x.rank() - 1] == 2 * half,
      "apply_rope: x has shape {}, expected [T = {}, ..., head_dim = {}]", x.shape(),
      table.cos.shape()[0], 2 * half);
  detail::check_dtype(op, "x", x, table.cos.dtype());
  Tensor out = detail::visit_floating(
      x.dtype(), op, [&]<class S>(type_tag<S>) { return apply_impl<S>(x, table); });
  scope.output(out).flops(3.0 * static_cast<double>(x.numel()));
  return out;
}

std::pair<Tensor, Tensor> rope(const Tensor& q, const Tensor& k, const RopeParams& p,
                               std::int64_t position_offset) {
  MESHTEST_CHECK(q.rank() >= 1 && k.rank() >= 1 && q.shape()[0] == k.shape()[0],
                 "rope: q {} and k {} must have the same number of tokens (dim 0)", q.shape(),
                 k.shape());
  MESHTEST_CHECK(q.dtype() == k.dtype(), "rope: q has dtype {} but k has dtype {}", q.dtype(),
                 k.dtype());
  perf::OpScope scope("rope");
  scope.input(q).input(k).attr("offset", position_offset);
  const RopeTable table = rope_table(p, q.shape()[0], position_offset, q.dtype());
  std::pair<Tensor, Tensor> out{apply_rope(q, table), apply_rope(k, table)};
  scope.output(out.first).output(out.second);
  return out;
}

}  // namespace meshtest
