// qkv_rope: weight blocks of whole heads, token panels through a small GEMM scratch, then each
// head rotated (q, k) or copied (v) into its output. A call is a plan (buffers, RoPE table,
// scratch) and its run; under a perf::Trace capture the run is recorded as a step.
#include "src/ops/qkv_rope.hpp"

#include <algorithm>
#include <memory>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"

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

// One call's plan: its buffers and sizes, the cos/sin table of its positions (compute type,
// made once) and its scratch. A trace step keeps it and reruns it (run_qkv_rope).
template <class S>
struct QkvRopePlan {
  using C = compute_t<S>;
  const S* x;
  const S* weight;
  const S* bias;
  Outputs<S> dst;
  Eigen::Index tokens, hidden, slots, block_slots, row_block;
  RowMatrix<C> cos, sin;       // [T, d/2]
  RowMatrix<C> x_c, w_c, b_c;  // bf16 inputs converted to f32 (unused for f32, f64)
  RowMatrix<C> y;              // [row_block, block_slots * d] GEMM scratch
};

template <class S>
std::shared_ptr<QkvRopePlan<S>> plan_qkv_rope(const Tensor& x, const Tensor& weight,
                                              const Tensor& bias, const QkvRopeOptions& o,
                                              Qkv& out) {
  const Eigen::Index d = o.rope.head_dim;
  const Eigen::Index tokens = x.shape()[0];
  const RopeTable table = rope_table(o.rope, tokens, o.position_offset, dtype_of<S>());
  return std::make_shared<QkvRopePlan<S>>(QkvRopePlan<S>{
      .x = x.data<S>(),
      .weight = weight.data<S>(),
      .bias = bias.data<S>(),
      .dst = {out.q.data<S>(), out.k.data<S>(), out.v.data<S>(), o.num_heads, o.num_kv_heads, d},
      .tokens = tokens,
      .hidden = x.shape()[1],
      .slots = o.num_heads + 2 * o.num_kv_heads,  // heads of the qkv columns
      .block_slots = std::max<Eigen::Index>(1, o.column_block / d),
      .row_block = o.row_block,
      .cos = detail::ComputeMatrix<S>(table.cos).map(),
      .sin = detail::ComputeMatrix<S>(table.sin).map(),
      .x_c = {},
      .w_c = {},
      .b_c = {},
      .y = {}});
}

// The work of a call: reads the inputs' current contents, writes q, k and v.
template <class S>
void run_qkv_rope(QkvRopePlan<S>& p) {
  using C = compute_t<S>;
  using Map = Eigen::Map<const RowMatrix<C>>;
  const Eigen::Index d = p.dst.d;
  const Map xm(detail::compute_view(p.x, p.tokens, p.hidden, p.x_c), p.tokens, p.hidden);
  const Map bm(detail::compute_view(p.bias, 1, p.slots * d, p.b_c), 1, p.slots * d);
  for (Eigen::Index s0 = 0; s0 < p.slots; s0 += p.block_slots) {
    const Eigen::Index ns = std::min(p.block_slots, p.slots - s0);
    const Map wb(detail::compute_view(p.weight + s0 * d * p.hidden, ns * d, p.hidden, p.w_c),
                 ns * d, p.hidden);
    for (Eigen::Index t0 = 0; t0 < p.tokens; t0 += p.row_block) {
      const Eigen::Index nt = std::min<Eigen::Index>(p.row_block, p.tokens - t0);
      p.y.noalias() = xm.middleRows(t0, nt) * wb.transpose();
      p.y.rowwise() += bm.row(0).segment(s0 * d, ns * d);
      detail::round_all<S>(p.y);  // the reference Linear's output dtype
      for (Eigen::Index t = 0; t < nt; ++t) {
        const Eigen::Index i = t0 + t;
        const C* c = p.cos.row(i).data();
        const C* s = p.sin.row(i).data();
        for (Eigen::Index h = 0; h < ns; ++h)
          p.dst.store(i, s0 + h, p.y.row(t).data() + h * d, c, s);
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
    std::shared_ptr<QkvRopePlan<S>> plan = plan_qkv_rope<S>(x, weight, bias, options, out);
    run_qkv_rope(*plan);
    if (perf::Trace* t = perf::Trace::active()) {
      t->add_step("qkv_rope", perf::OpType::compute, {&x, &weight, &bias}, {&out.q, &out.k, &out.v},
                  [plan] { run_qkv_rope(*plan); });
    }
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
