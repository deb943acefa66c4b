// The attention sections of meshtest-bench fused: sdpa_sinks vs sdpa (time and peak heap inside
// the call) and qkv_rope vs linear + split_qkv + rope (time), single device.
#include "bench/fused_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <tuple>

#include "bench/fused_common.hpp"
#include "bench/heap_counter.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/models/gpt_oss_config.hpp"
#include "src/ops/attention.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/ops/rope.hpp"
#include "src/ops/sdpa.hpp"
#include "src/ops/sdpa_sinks.hpp"

namespace meshtest::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Timing {
  double median_ms = 0, min_ms = 0;
  std::int64_t peak = 0;  ///< heap bytes, the first call
};

// The first call inside a HeapWindow (it counts as a warm-up), then time_calls_ms.
template <class T>
Timing measure(const AttentionBenchOptions& o, const std::function<T()>& f, T& out) {
  Timing t;
  {
    const HeapWindow heap;
    out = f();
    t.peak = heap.peak();
  }
  std::tie(t.median_ms, t.min_ms) = time_calls_ms<T>(std::max(0, o.warmup - 1), o.iters, f, out);
  return t;
}

// Bytes of one value of the compute type of `dtype` (f64: 8, else f32's 4).
std::int64_t compute_bytes(DType dtype) { return dtype == DType::f64 ? 8 : 4; }

// MemAvailable of /proc/meminfo in bytes; 0 when unknown.
std::int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

Tensor seeded(const AttentionBenchOptions& o, Shape s, std::uint64_t stream, double std = 1) {
  return random_normal(std::move(s), o.dtype, {.seed = o.seed, .stream = stream}, 0.0, std);
}

// The error bound of max |ref - fused| / max(1, max |ref|): bf16 sdpa rounds each step to bf16
// where sdpa_sinks rounds once (a few bf16 ulps); f32 and f64 only add the same `terms` per
// element in another order (the error model's bound per unit of scale, docs/tolerances.md).
double bound(DType dtype, double bf16_ulps, std::int64_t terms) {
  if (dtype == DType::bf16) return bf16_ulps * std::ldexp(1.0, -8);
  return error_bound({.dtype = dtype, .terms = terms}, 1.0, 1.0);
}

const char* verdict(bool ok) { return ok ? "meets" : "MISSES"; }

// One (T, window) case of the sdpa section; returns whether the outputs agree.
bool sdpa_case(const AttentionBenchOptions& o, std::int64_t t, std::int64_t window) {
  const std::int64_t kv = o.kv_heads, d = o.head_dim, per_kv = o.heads / kv;
  const Tensor q = seeded(o, {t, kv, per_kv, d}, 1), k = seeded(o, {t, kv, d}, 2);
  const Tensor v = seeded(o, {t, kv, d}, 3), sinks = seeded(o, {o.heads}, 4);
  const SdpaOptions so{.sliding_window = window};
  const std::int64_t c = compute_bytes(o.dtype);
  const double t2 = static_cast<double>(t) * static_cast<double>(t) * static_cast<double>(c);
  const double td = static_cast<double>(t * o.heads * d * c);
  fmt::print("  T {}, {}:\n", t,
             window > 0 ? fmt::format("sliding window {}", window) : std::string("full causal"));
  Tensor fused, ref;
  const Timing f = measure<Tensor>(
      o, [&] { return sdpa_sinks(q, k, v, sinks, so); }, fused);
  // sdpa holds one head's T x T logits, the [T, H d] output in the compute type and (bf16) the
  // compute copies of q, k and v (2 T H d in all at most) besides its result.
  const double needed = t2 + 3 * td;
  const std::int64_t avail = available_memory();
  fmt::print("    {:<44} {:>10} {:>10} {:>9} {:>11} {:>9} {:>9}\n", "", "median ms", "min ms",
             "/ fused", "peak MiB", "/ fused", "max err");
  if (avail > 0 && needed > static_cast<double>(avail) / 2) {
    fmt::print("    sdpa (reference): skipped: needs {:.1f} GB, {:.1f} GB available\n",
               needed / 1e9, static_cast<double>(avail) / 1e9);
    fmt::print("    {:<44} {:>10.1f} {:>10.1f} {:>9} {:>11.1f}\n", "sdpa_sinks (fused)",
               f.median_ms, f.min_ms, "", static_cast<double>(f.peak) / kMiB);
    return true;
  }
  const Timing r = measure<Tensor>(
      o, [&] { return sdpa(q, k, v, sinks, so); }, ref);
  // q·k over head_dim, the softmax denominator and p·v over the keys.
  const double err = scaled_error(ref, fused), b = bound(o.dtype, 8, o.head_dim + 2 * t + 1);
  fmt::print("    {:<44} {:>10.1f} {:>10.1f} {:>9} {:>11.1f} {:>9}\n", "sdpa (reference)",
             r.median_ms, r.min_ms, "", static_cast<double>(r.peak) / kMiB, "");
  fmt::print(
      "    {:<44} {:>10.1f} {:>10.1f} {:>9.2f} {:>11.1f} {:>9.2f} {:>9.2g}\n", "sdpa_sinks (fused)",
      f.median_ms, f.min_ms, r.median_ms / f.median_ms, static_cast<double>(f.peak) / kMiB,
      static_cast<double>(r.peak) / static_cast<double>(std::max<std::int64_t>(f.peak, 1)), err);
  fmt::print(
      "    memory: T² x {} B (one head's T x T logits) {:.1f} MiB; H T² x {} B (all heads at "
      "once) {:.1f} MiB; T H d x {} B (the output) {:.1f} MiB\n",
      c, t2 / kMiB, c, static_cast<double>(o.heads) * t2 / kMiB, c, td / kMiB);
  // The O(T·d) yardstick: q, k and v in the compute type, T (H + 2 KV) d values.
  const double inputs = static_cast<double>(t * (o.heads + 2 * kv) * d * c);
  const double extra = static_cast<double>(f.peak) - static_cast<double>(fused.nbytes());
  fmt::print(
      "    target: fused faster: {:.2f} x {}; fused peak O(T·d), no T x T matrix: "
      "{:.1f} MiB = the output {:.1f} MiB + {:.2f} MiB working ({:.2f} x q, k, v's T (H + 2 KV) "
      "d x {} B = {:.1f} MiB; {:.2f} x T² x {} B) {}\n",
      r.median_ms / f.median_ms, verdict(r.median_ms > f.median_ms),
      static_cast<double>(f.peak) / kMiB, static_cast<double>(fused.nbytes()) / kMiB, extra / kMiB,
      extra / inputs, c, inputs / kMiB, extra / t2, c, verdict(extra <= inputs));
  fmt::print("    outputs agree (max err / max |ref| <= {:.2g}): {}\n", b,
             err <= b ? "PASS" : "FAIL");
  return err <= b;
}

}  // namespace

void check_attention_options(const AttentionBenchOptions& o) {
  MESHTEST_CHECK(!o.sdpa_tokens.empty(), "attention bench: no sdpa length");
  for (const std::int64_t t : o.sdpa_tokens)
    MESHTEST_CHECK(t >= 1, "attention bench: sdpa length {} is < 1", t);
  MESHTEST_CHECK(
      o.qkv_tokens >= 1 && o.heads >= 1 && o.kv_heads >= 1 && o.head_dim >= 1 && o.hidden >= 1,
      "attention bench: tokens, heads, kv heads, head dim and hidden must be >= 1; "
      "got {}, {}, {}, {}, {}",
      o.qkv_tokens, o.heads, o.kv_heads, o.head_dim, o.hidden);
  MESHTEST_CHECK(o.heads % o.kv_heads == 0, "attention bench: kv heads {} do not divide heads {}",
                 o.kv_heads, o.heads);
  MESHTEST_CHECK(o.head_dim % 2 == 0, "attention bench: head dim {} is odd (RoPE)", o.head_dim);
  MESHTEST_CHECK(o.window >= 0, "attention bench: window {} is < 0", o.window);
  MESHTEST_CHECK(o.qkv_row_block >= 1 && o.qkv_column_block >= 1,
                 "attention bench: qkv_rope row block {} and column block {} must be >= 1",
                 o.qkv_row_block, o.qkv_column_block);
  MESHTEST_CHECK(o.iters >= 1 && o.warmup >= 0,
                 "attention bench: iters must be >= 1 and warmup >= 0; got {}, {}", o.iters,
                 o.warmup);
}

bool sdpa_section(const AttentionBenchOptions& o) {
  check_attention_options(o);
  fmt::print(
      "sdpa_sinks (flash-style: online softmax over key blocks, no T x T matrix) vs sdpa (the "
      "attention block's op) — {}, {} q heads, {} kv heads, head_dim {}; median of {} calls "
      "after {} warm-up; peak = heap bytes inside the first call (output included)\n",
      dtype_name(o.dtype), o.heads, o.kv_heads, o.head_dim, o.iters, std::max(1, o.warmup));
  bool ok = true;
  for (const std::int64_t t : o.sdpa_tokens) {
    if (o.window > 0) ok = sdpa_case(o, t, o.window) && ok;
    ok = sdpa_case(o, t, 0) && ok;
  }
  return ok;
}

bool qkv_rope_section(const AttentionBenchOptions& o) {
  check_attention_options(o);
  const std::int64_t t = o.qkv_tokens, kv = o.kv_heads, d = o.head_dim;
  const std::int64_t rows = (o.heads + 2 * kv) * d;
  const Tensor x = seeded(o, {t, o.hidden}, 5);
  const Tensor w = seeded(o, {rows, o.hidden}, 6, 1 / std::sqrt(static_cast<double>(o.hidden)));
  const Tensor bias = seeded(o, {rows}, 7, 0.1);
  GptOssConfig c = GptOssConfig::gpt_oss_20b();
  c.head_dim = d;
  const RopeParams rp = c.rope_params();
  fmt::print(
      "qkv_rope (panels of tokens x blocks of heads, bias and RoPE applied in the panel) vs "
      "linear + split_qkv + rope — {}, T {}, hidden {}, qkv {} ({} q + 2 x {} kv heads of {}); "
      "median of {} calls after {} warm-up\n",
      dtype_name(o.dtype), t, o.hidden, rows, o.heads, kv, d, o.iters, std::max(1, o.warmup));
  const QkvRopeOptions qo{.num_heads = o.heads,
                          .num_kv_heads = kv,
                          .rope = rp,
                          .row_block = o.qkv_row_block,
                          .column_block = o.qkv_column_block};
  const std::int64_t block_columns = std::max<std::int64_t>(1, qo.column_block / d) * d;
  Qkv fused, ref;
  const Timing f = measure<Qkv>(
      o, [&] { return qkv_rope(x, w, bias, qo); }, fused);
  const Timing r = measure<Qkv>(
      o,
      [&] {
        Qkv s = split_qkv(linear(x, w, bias), o.heads, kv, d);
        auto [q, k] = rope(s.q, s.k, rp, 0);
        return Qkv{.q = std::move(q), .k = std::move(k), .v = std::move(s.v)};
      },
      ref);
  // The sequence's first op alone: one GEMM over every qkv column, and the bias.
  Tensor linear_out;
  const Timing g = measure<Tensor>(
      o, [&] { return linear(x, w, bias); }, linear_out);
  const double err = std::max(
      {scaled_error(ref.q, fused.q), scaled_error(ref.k, fused.k), scaled_error(ref.v, fused.v)});
  const double b = bound(o.dtype, 2, o.hidden + 1), ratio = r.median_ms / f.median_ms;
  fmt::print("  {:<44} {:>10} {:>10} {:>9} {:>11} {:>9}\n", "", "median ms", "min ms", "/ fused",
             "peak MiB", "max err");
  fmt::print("  {:<44} {:>10.1f} {:>10.1f} {:>9.2f} {:>11.1f}\n", "linear + split_qkv + rope",
             r.median_ms, r.min_ms, ratio, static_cast<double>(r.peak) / kMiB);
  fmt::print("  {:<44} {:>10.1f} {:>10.1f} {:>9.2f} {:>11.1f}\n", "  of which linear (GEMM + bias)",
             g.median_ms, g.min_ms, g.median_ms / f.median_ms, static_cast<double>(g.peak) / kMiB);
  fmt::print("  {:<44} {:>10.1f} {:>10.1f} {:>9} {:>11.1f} {:>9.2g}\n", "qkv_rope (fused)",
             f.median_ms, f.min_ms, "", static_cast<double>(f.peak) / kMiB, err);
  const double share = g.median_ms / r.median_ms;
  fmt::print(
      "  the linear is {:.1f} % of the sequence: a fusion whose GEMMs take as long as it, with "
      "nothing else left, is at most {:.3f} x faster. qkv_rope multiplies panels of {} tokens "
      "by weight blocks of {} columns ({} heads) instead of all {} at once, with the bias and "
      "RoPE in the panel and no [T, {}] tensor (peak MiB)\n",
      100.0 * share, 1.0 / share, std::min(qo.row_block, t), block_columns, block_columns / d, rows,
      rows);
  fmt::print("  target: qkv_rope >= 1.1 x faster than the sequence: {:.2f} x {}\n", ratio,
             verdict(ratio >= 1.1));
  fmt::print("  outputs agree (max err / max |ref| <= {:.2g}): {}\n", b,
             err <= b ? "PASS" : "FAIL");
  return err <= b;
}

}  // namespace meshtest::bench
