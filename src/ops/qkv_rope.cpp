// qkv_rope: weight blocks of whole heads, token panels through a small GEMM scratch, then each
// head rotated (q, k) or copied (v) into its output.
#include "src/ops/qkv_rope.hpp"

#include <algorithm>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;

// One head vector x [d] rotated by one table row into o: the half-split rotation of apply_rope,
// with its bf16 rounding of every product and sum.
template <class S>
void rotate_head(const compute_t<S>* x, S* o, const compute_t<S>* cos, const compute_t<S>* sin,
                 Eigen::Index half) {
  const auto r = [](compute_t<S> v) { return detail::round_as<S>(v); };
  for (Eigen::Index j = 0; j < half; ++j) {
    const compute_t<S> x1 = x[j];
    const compute_t<S> x2 = x[half + j];
    o[j] = static_cast<S>(r(x1 * cos[j]) - r(x2 * sin[j]));
    o[half + j] = static_cast<S>(r(x2 * cos[j]) + r(x1 * sin[j]));
  }
}

// Where head slot s of a qkv row goes: q heads first, then k heads, then v heads.
template <class S>
struct Outputs {
  S* q;
  S* k;
  S* v;
  Eigen::Index heads;
  Eigen::Index kv_heads;
  Eigen::Index d;

  // Rotates or copies head slot `slot` of token `i` (its d values at `src`) into place.
  void store(Eigen::Index i, Eigen::Index slot, const compute_t<S>* src, const compute_t<S>* cos,
             const compute_t<S>* sin) const {
    if (slot < heads) {
      rotate_head<S>(src, q + (i * heads + slot) * d, cos, sin, d / 2);
    } else if (slot < heads + kv_heads) {
      rotate_head<S>(src, k + (i * kv_heads + slot - heads) * d, cos, sin, d / 2);
    } else {
      S* o = v + (i * kv_heads + slot - heads - kv_heads) * d;
      for (Eigen::Index c = 0; c < d; ++c) o[c] = static_cast<S>(src[c]);
    }
  }
};

template <class S>
void qkv_rope_impl(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const QkvRopeOptions& o, Qkv& out) {
  using C = compute_t<S>;
  const Eigen::Index tokens = x.shape()[0];
  const Eigen::Index hidden = x.shape()[1];
  const Eigen::Index d = o.rope.head_dim;
  const Eigen::Index slots = o.num_heads + 2 * o.num_kv_heads;  // heads of the qkv columns
  const Eigen::Index block_slots = std::max<Eigen::Index>(1, o.column_block / d);
  const Outputs<S> dst{out.q.data<S>(), out.k.data<S>(), out.v.data<S>(),
                       o.num_heads,     o.num_kv_heads,  d};
  const RopeTable table = rope_table(o.rope, tokens, o.position_offset, dtype_of<S>());
  const detail::ComputeMatrix<S> cos_m(table.cos);
  const detail::ComputeMatrix<S> sin_m(table.sin);
  const detail::ComputeMatrix<S> xm(x, 0, tokens, hidden);
  const detail::ComputeMatrix<S> bm(bias, 0, 1, slots * d);
  RowMatrix<C> y;  // [row_block, block_slots * d] scratch
  for (Eigen::Index s0 = 0; s0 < slots; s0 += block_slots) {
    const Eigen::Index ns = std::min(block_slots, slots - s0);
    const detail::ComputeMatrix<S> wb(weight, s0 * d * hidden, ns * d, hidden);
    for (Eigen::Index t0 = 0; t0 < tokens; t0 += o.row_block) {
      const Eigen::Index nt = std::min<Eigen::Index>(o.row_block, tokens - t0);
      y.noalias() = xm.map().middleRows(t0, nt) * wb.map().transpose();
      y.rowwise() += bm.map().row(0).segment(s0 * d, ns * d);
      detail::round_all<S>(y);  // the reference Linear's output dtype
      for (Eigen::Index t = 0; t < nt; ++t) {
        const Eigen::Index i = t0 + t;
        const C* c = cos_m.map().row(i).data();
        const C* s = sin_m.map().row(i).data();
        for (Eigen::Index h = 0; h < ns; ++h) dst.store(i, s0 + h, y.row(t).data() + h * d, c, s);
      }
    }
  }
}

void check_options(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const QkvRopeOptions& o) {
  constexpr std::string_view op = "qkv_rope";
  detail::check_rank(op, "x ([T, hidden])", x, 2);
  MESHTEST_CHECK(o.num_heads > 0 && o.num_kv_heads > 0 && o.num_heads % o.num_kv_heads == 0,
                 "qkv_rope: num_heads {} must be a positive multiple of num_kv_heads {}",
                 o.num_heads, o.num_kv_heads);
  MESHTEST_CHECK(o.rope.head_dim > 0 && o.rope.head_dim % 2 == 0,
                 "qkv_rope: rope.head_dim is {}, expected a positive even number", o.rope.head_dim);
  const std::int64_t qkv_dim = (o.num_heads + 2 * o.num_kv_heads) * o.rope.head_dim;
  detail::check_shape(op, "weight ([(heads + 2 kv_heads) * head_dim, hidden])", weight,
                      Shape{qkv_dim, x.shape()[1]});
  detail::check_shape(op, "bias", bias, Shape{qkv_dim});
  detail::check_dtype(op, "weight", weight, x.dtype());
  detail::check_dtype(op, "bias", bias, x.dtype());
  MESHTEST_CHECK(o.position_offset >= 0, "qkv_rope: position_offset is {}, expected >= 0",
                 o.position_offset);
  MESHTEST_CHECK(o.row_block >= 1 && o.column_block >= 1,
                 "qkv_rope: row_block {} and column_block {} must be >= 1", o.row_block,
                 o.column_block);
}

}  // namespace

Qkv qkv_rope(const Tensor& x, const Tensor& weight, const Tensor& bias,
             const QkvRopeOptions& options) {
  perf::OpScope scope("qkv_rope", perf::OpScope::fused);
  scope.input(x).input(weight).input(bias);
  scope.attr("heads", options.num_heads)
      .attr("kv_heads", options.num_kv_heads)
      .attr("head_dim", options.rope.head_dim)
      .attr("offset", options.position_offset);
  check_options(x, weight, bias, options);
  const std::int64_t tokens = x.shape()[0];
  const std::int64_t kv_heads = options.num_kv_heads;
  const std::int64_t d = options.rope.head_dim;
  const Tensor::Uninitialized fill_later;
  Qkv out{Tensor(Shape{tokens, kv_heads, options.num_heads / kv_heads, d}, x.dtype(), fill_later),
          Tensor(Shape{tokens, kv_heads, d}, x.dtype(), fill_later),
          Tensor(Shape{tokens, kv_heads, d}, x.dtype(), fill_later)};
  detail::visit_floating(x.dtype(), "qkv_rope", [&]<class S>(type_tag<S>) {
    qkv_rope_impl<S>(x, weight, bias, options, out);
  });
  // The GEMM and its bias, then 3 flops per rotated element (as apply_rope counts them).
  const double rows = static_cast<double>(tokens);
  const double qkv_dim = static_cast<double>(weight.shape()[0]);
  scope.output(out.q).output(out.k).output(out.v);
  scope.flops(rows * qkv_dim * (2.0 * static_cast<double>(x.shape()[1]) + 1.0) +
              3.0 * static_cast<double>(out.q.numel() + out.k.numel()));
  return out;
}

}  // namespace meshtest
