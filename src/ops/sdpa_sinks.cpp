// sdpa_sinks: per kv head, query tiles against key blocks with an online softmax and the sink.
// A call is a plan (buffers, options, scratch) and its run; under a perf::Trace capture the run
// is recorded as a step.
#include "src/ops/sdpa_sinks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "src/ops/attention_mask.hpp"
#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace meshtest {
namespace {

using detail::compute_t;

template <class C>
using Column = Eigen::Array<C, Eigen::Dynamic, 1>;

// The state of one query tile. Row r = i * q_per_kv + m holds query i0 + i, head g * q_per_kv + m
// (the q_per_kv heads of one query are adjacent rows of q and of the output).
template <class C>
struct Tile {
  RowMatrix<C> q;    // [rows, d]
  RowMatrix<C> s;    // [rows, keys of the block]: logits, then their exp weights
  RowMatrix<C> acc;  // [rows, d]: sum of weight · v, scaled to the running max
  Column<C> max;     // running max of the logits seen, started at the sink
  Column<C> denom;   // running sum of exp(logit - max), the sink included
};

// Keys [begin, end) that some query at positions first_q .. last_q sees (key j sits at
// k_offset + j): the causal edge bounds the end, the window the beginning.
struct KeyRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

KeyRange visible_keys(std::int64_t first_q, std::int64_t last_q, std::int64_t k_offset,
                      std::int64_t tk, std::int64_t window) {
  KeyRange r;
  r.end = std::clamp<std::int64_t>(last_q - k_offset + 1, 0, tk);
  const std::int64_t rel = first_q - k_offset;  // first query's position in key rows
  if (window > 0 && window <= rel) r.begin = std::min(rel - window + 1, r.end);
  return r;
}

// Sets to -inf the logits of the keys a row's query does not see. Row r holds the query at
// first_q + r / q_per_kv, column c the key at first_k + c.
template <class C>
void mask_block(RowMatrix<C>& s, std::int64_t first_q, Eigen::Index q_per_kv, std::int64_t first_k,
                const MaskSpec& mask) {
  const std::int64_t last_q = first_q + (s.rows() - 1) / q_per_kv;
  const std::int64_t last_k = first_k + s.cols() - 1;
  // The corners decide: the latest key for the earliest query (causal), the earliest key for
  // the latest query (window).
  if (key_visible(first_q, last_k, mask) && key_visible(last_q, first_k, mask)) return;
  for (Eigen::Index r = 0; r < s.rows(); ++r) {
    const std::int64_t q_pos = first_q + r / q_per_kv;
    for (Eigen::Index c = 0; c < s.cols(); ++c) {
      if (!key_visible(q_pos, first_k + c, mask)) s(r, c) = -std::numeric_limits<C>::infinity();
    }
  }
}

// Folds a key block into the tile: t.s holds its masked, scaled logits; vb its values.
template <class C, class V>
void online_update(Tile<C>& t, const V& vb) {
  for (Eigen::Index r = 0; r < t.s.rows(); ++r) {
    const C m = std::max(t.max(r), t.s.row(r).maxCoeff());
    if (m == -std::numeric_limits<C>::infinity()) {  // -inf sink and no key seen yet
      t.s.row(r).setZero();
      continue;
    }
    const C rescale = std::exp(t.max(r) - m);
    t.s.row(r) = (t.s.row(r).array() - m).exp().matrix();
    t.denom(r) = t.denom(r) * rescale + t.s.row(r).sum();
    t.acc.row(r) *= rescale;
    t.max(r) = m;
  }
  t.acc.noalias() += t.s * vb;
}

// One call's plan: its buffers, sizes and options, and its scratch (the tile, bf16 copies of k,
// v and sinks). A trace step keeps it and reruns it (run_sdpa_sinks).
template <class S>
struct SdpaSinksPlan {
  using C = compute_t<S>;
  const S* q;
  const S* k;
  const S* v;
  const S* sinks;
  S* out;
  Eigen::Index tq, kv_heads, q_per_kv, d, tk, block;
  C scale;
  std::int64_t q_offset, k_offset;
  MaskSpec mask;
  Tile<C> tile = {};
  RowMatrix<C> k_c = {}, v_c = {}, sinks_c = {};
};

template <class S>
std::shared_ptr<SdpaSinksPlan<S>> plan_sdpa_sinks(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const Tensor& sinks, const SdpaOptions& o,
                                                  Eigen::Index block, Tensor& out) {
  using C = compute_t<S>;
  const Eigen::Index d = q.shape()[3];
  return std::make_shared<SdpaSinksPlan<S>>(SdpaSinksPlan<S>{
      .q = q.data<S>(),
      .k = k.data<S>(),
      .v = v.data<S>(),
      .sinks = sinks.data<S>(),
      .out = out.data<S>(),
      .tq = q.shape()[0],
      .kv_heads = q.shape()[1],
      .q_per_kv = q.shape()[2],
      .d = d,
      .tk = k.shape()[0],
      .block = block,
      .scale = static_cast<C>(o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)))),
      .q_offset = o.q_offset,
      .k_offset = o.k_offset,
      .mask = {.causal = true, .sliding_window = o.sliding_window}});
}

// Flushes denormal results and inputs to zero (x86 MXCSR FTZ and DAZ) for its lifetime, then
// restores the caller's mode. Eigen's vectorized exp clamps its argument near -88.4, so a
// masked logit (-inf) gets the weight exp(-88.4) ~ 4.9e-39, a denormal, not 0; on Intel cores
// every GEMM that then multiplies those weights takes a microcode assist per denormal (an
// order of magnitude of time; docs/design.md, "Measured reasons"). Flushed, a masked key's
// weight is exactly 0, as it should be, and a
// weight below 1.2e-38 of the row's largest (1) is far below f32's resolution of the sum.
class FlushDenormals {
 public:
#if defined(__SSE__) || defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtz = 0x8000u;  // flush-to-zero (results)
  static constexpr unsigned kDaz = 0x0040u;  // denormals-are-zero (inputs)
  unsigned saved_;
#else
  FlushDenormals() = default;  // elsewhere: no mode to set (the results are the same)
#endif
 public:
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

// The work of a call: reads the inputs' current contents, writes out ([Tq, heads * d]);
// returns the flops of the blocks computed. Denormals are flushed (FlushDenormals).
template <class S>
double run_sdpa_sinks(SdpaSinksPlan<S>& p) {
  using C = compute_t<S>;
  const FlushDenormals flush;
  const Eigen::Index tq = p.tq, kv_heads = p.kv_heads, q_per_kv = p.q_per_kv, d = p.d;
  const Eigen::Index tk = p.tk, block = p.block;
  const Eigen::Index heads = kv_heads * q_per_kv;
  const Eigen::Map<const RowMatrix<S>> qm(p.q, tq * heads, d);  // row i * heads + h
  Eigen::Map<RowMatrix<S>> om(p.out, tq * heads, d);
  if (tk == 0 || heads == 0) {  // no key (nor key data to point into), or no head: output 0
    om.setZero();
    return 0.0;
  }
  const C* kc = detail::compute_view(p.k, tk * kv_heads, d, p.k_c);  // row j * kv_heads + g
  const C* vc = detail::compute_view(p.v, tk * kv_heads, d, p.v_c);
  const C* sc = detail::compute_view(p.sinks, heads, 1, p.sinks_c);
  Tile<C>& t = p.tile;
  double flops = 0;
  for (Eigen::Index g = 0; g < kv_heads; ++g) {
    const detail::StridedRowMap<C> kg(kc + g * d, tk, d, Eigen::OuterStride<>(kv_heads * d));
    const detail::StridedRowMap<C> vg(vc + g * d, tk, d, Eigen::OuterStride<>(kv_heads * d));
    const Eigen::Map<const Column<C>> group_sinks(sc + g * q_per_kv, q_per_kv);
    for (Eigen::Index i0 = 0; i0 < tq; i0 += block) {
      const Eigen::Index nq = std::min(block, tq - i0);
      const Eigen::Index rows = nq * q_per_kv;
      t.q.resize(rows, d);
      for (Eigen::Index i = 0; i < nq; ++i) {
        t.q.middleRows(i * q_per_kv, q_per_kv) =
            qm.middleRows((i0 + i) * heads + g * q_per_kv, q_per_kv).template cast<C>();
      }
      t.max = group_sinks.replicate(nq, 1);
      t.denom = (t.max == -std::numeric_limits<C>::infinity()).select(C(0), Column<C>::Ones(rows));
      t.acc.setZero(rows, d);
      const std::int64_t first_q = p.q_offset + i0;
      const KeyRange keys =
          visible_keys(first_q, first_q + nq - 1, p.k_offset, tk, p.mask.sliding_window);
      for (std::int64_t j0 = keys.begin; j0 < keys.end; j0 += block) {
        const Eigen::Index nk = std::min<Eigen::Index>(block, keys.end - j0);
        t.s.noalias() = t.q * kg.middleRows(j0, nk).transpose();
        t.s *= p.scale;
        mask_block(t.s, first_q, q_per_kv, p.k_offset + j0, p.mask);
        online_update(t, vg.middleRows(j0, nk));
        flops += 4.0 * static_cast<double>(rows * nk * d);
      }
      // A row that saw nothing (-inf sink) has acc 0 and denom 0: its output is 0.
      t.denom = (t.denom == C(0)).select(Column<C>::Ones(rows), t.denom);
      for (Eigen::Index i = 0; i < nq; ++i) {
        om.middleRows((i0 + i) * heads + g * q_per_kv, q_per_kv) =
            (t.acc.middleRows(i * q_per_kv, q_per_kv).array().colwise() /
             t.denom.segment(i * q_per_kv, q_per_kv))
                .matrix()
                .template cast<S>();
      }
    }
  }
  return flops;
}

}  // namespace

Tensor sdpa_sinks(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                  const SdpaOptions& options, std::int64_t block) {
  constexpr std::string_view op = "sdpa_sinks";
  perf::OpScope scope(op, perf::OpScope::fused);
  scope.input(q).input(k).input(v).input(sinks);
  scope.attr("window", options.sliding_window)
      .attr("q_offset", options.q_offset)
      .attr("k_offset", options.k_offset)
      .attr("block", block);
  check_sdpa_args(op, q, k, v, sinks, options);
  const std::int64_t kv_heads = q.shape()[1];
  const std::int64_t d = q.shape()[3];
  MESHTEST_CHECK(block >= 1, "sdpa_sinks: block is {}, expected >= 1", block);
  Tensor out(Shape{q.shape()[0], kv_heads * q.shape()[2] * d}, q.dtype(), Tensor::Uninitialized{});
  const double flops = detail::visit_floating(q.dtype(), op, [&]<class S>(type_tag<S>) {
    std::shared_ptr<SdpaSinksPlan<S>> plan =
        plan_sdpa_sinks<S>(q, k, v, sinks, options, block, out);
    const double n = run_sdpa_sinks(*plan);
    if (perf::Trace* t = perf::Trace::active()) {
      t->add_step(op, perf::OpType::compute, {&q, &k, &v, &sinks}, {&out},
                  [plan] { run_sdpa_sinks(*plan); });
    }
    return n;
  });
  // q·k and weights·v over the key blocks computed (masked entries of those blocks included).
  scope.output(out).flops(flops);
  return out;
}

}  // namespace meshtest
