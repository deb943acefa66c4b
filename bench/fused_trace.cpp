// trace_vs_eager: qkv_rope -> sdpa_sinks eagerly and by perf::Trace replay, profiled.
#include "bench/fused_trace.hpp"

#include <fmt/format.h>

#include <functional>
#include <vector>

#include "src/core/random.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/ops/sdpa_sinks.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::bench {
namespace {

// `warmup` calls of f, then `iterations` between the start/stop signposts, all profiled;
// the aggregate of the measured ones.
perf::Aggregate profile(const std::function<void()>& f, int warmup, int iterations) {
  const perf::Session session;
  for (int i = 0; i < warmup; ++i) f();
  perf::signpost("start");
  for (int i = 0; i < iterations; ++i) f();
  perf::signpost("stop");
  return perf::aggregate(perf::records(), {.iterations = iterations});
}

double ratio(double num, double den) { return den == 0 ? 0.0 : num / den; }

}  // namespace

TraceVsEager trace_vs_eager(const TraceVsEagerOptions& o) {
  const GptOssConfig& c = o.config;
  c.validate();
  MESHTEST_CHECK(o.tokens >= 1 && o.tp >= 1 && o.warmup >= 0 && o.iterations >= 1,
                 "trace_vs_eager: tokens {}, tp {}, iterations {} must be >= 1 and warmup {} >= 0",
                 o.tokens, o.tp, o.iterations, o.warmup);
  MESHTEST_CHECK(c.num_attention_heads % o.tp == 0 && c.num_key_value_heads % o.tp == 0,
                 "trace_vs_eager: tp {} must divide the {} q heads and {} kv heads", o.tp,
                 c.num_attention_heads, c.num_key_value_heads);
  const std::int64_t heads = c.num_attention_heads / o.tp, kv = c.num_key_value_heads / o.tp;
  const std::int64_t d = c.head_dim, qkv = (heads + 2 * kv) * d;
  const QkvRopeOptions qo{.num_heads = heads, .num_kv_heads = kv, .rope = c.rope_params()};
  const SdpaOptions so{.sliding_window = c.layer_sliding_window(o.layer)};

  perf::Trace trace;
  const Tensor& x = trace.input(random_normal({o.tokens, c.hidden_size}, o.dtype, {.seed = 1}));
  const Tensor& w =
      trace.input(random_normal({qkv, c.hidden_size}, o.dtype, {.seed = 2}, 0.0, 0.02));
  const Tensor& b = trace.input(random_normal({qkv}, o.dtype, {.seed = 3}, 0.0, 0.02));
  const Tensor& sinks = trace.input(random_normal({heads}, o.dtype, {.seed = 4}));

  Tensor eager_out;
  const auto eager = [&] {
    const Qkv r = qkv_rope(x, w, b, qo);
    eager_out = sdpa_sinks(r.q, r.k, r.v, sinks, so);
  };
  TraceVsEager out;
  out.eager = profile(eager, o.warmup, o.iterations);

  const Tensor* replay_out = nullptr;
  trace.capture([&] {
    Qkv r = qkv_rope(x, w, b, qo);
    const Tensor& q = trace.keep(std::move(r.q));
    const Tensor& k = trace.keep(std::move(r.k));
    const Tensor& v = trace.keep(std::move(r.v));
    replay_out = &trace.keep(sdpa_sinks(q, k, v, sinks, so));
  });
  out.replay = profile([&] { trace.replay(); }, o.warmup, o.iterations);
  MESHTEST_CHECK(replay_out->bitwise_equal(eager_out),
                 "trace_vs_eager: the replay's output differs from the eager call's");

  out.kernel_ratio = ratio(out.replay.total_kernel_duration_us, out.eager.total_kernel_duration_us);
  out.latency_ratio =
      ratio(out.replay.total_op_to_op_latency_us, out.eager.total_op_to_op_latency_us);
  if (o.print) {
    fmt::print(
        "trace_vs_eager: qkv_rope -> sdpa_sinks, T {}, hidden {}, {} q / {} kv heads of {} "
        "(tp {}), window {}, {}, {} iterations after {} warm-up\n",
        o.tokens, c.hidden_size, heads, kv, d, o.tp, so.sliding_window, o.dtype, o.iterations,
        o.warmup);
    for (const auto& [name, a] : {std::pair{"eager ", &out.eager}, {"replay", &out.replay}}) {
      fmt::print("  {}: total_kernel_duration_us {:.2f} total_op_to_op_latency_us {:.2f}\n", name,
                 a->total_kernel_duration_us, a->total_op_to_op_latency_us);
    }
    fmt::print("  replay / eager: kernel duration {:.3f}, op-to-op latency {:.3f}\n",
               out.kernel_ratio, out.latency_ratio);
  }
  return out;
}

}  // namespace meshtest::bench
