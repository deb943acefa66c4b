// The attention's kernels on one GPU against the CPU ops on the same inputs (src/gpu/rope.hpp,
// qkv_rope.hpp): RoPE's rotation and the YaRN rope of queries and keys, bit for bit in f32 and
// bf16 (the table is the host's, each product and sum rounded as on the host), every head
// layout, position offsets past the initial context, plain RoPE (s <= 1), no tokens; the fused
// qkv_rope within the model of its Linear (and its split and rotation exact); attention with
// sinks within the model of the CPU's flash form (prefill, decode against a cache, the sliding
// window, GQA, rows that see no key, a prefill of 8192 tokens, bf16 on tensor cores), and a
// batch of sequences over their own keys in one call; the KV cache's writes and reads (and a
// batch of caches' writes in one launch) bit for bit against the CPU's, and decode steps against
// it; the model's input, the rows of a vocab shard of the embedding (src/gpu/embedding.hpp), bit
// for bit; the bad inputs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/embedding.hpp"
#include "src/gpu/kv_cache.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/qkv_rope.hpp"
#include "src/gpu/rope.hpp"
#include "src/gpu/sdpa.hpp"
#include "src/ops/embedding.hpp"
#include "src/ops/kv_cache.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/ops/rope.hpp"
#include "src/ops/sdpa_sinks.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::gpu {
namespace {

using test_support::expect_error;

/// The default stream: every op below is followed by a copy back, which waits for it.
constexpr cudaStream_t kStream = nullptr;

DeviceTensor on_gpu(const Tensor& t) { return DeviceTensor::from_host(t); }

/// Expects the GPU's result to hold the CPU's bits, naming the worst element otherwise.
void expect_bits(const Tensor& want, const DeviceTensor& got, const std::string& what) {
  const Tensor g = got.to_host();
  EXPECT_TRUE(g.bitwise_equal(want))
      << what << ": "
      << (g.shape() == want.shape()
              ? compare(want.astype(DType::f64), g.astype(DType::f64), Metric::exact, 0).str()
              : fmt::format("got {}, want {}", g.shape(), want.shape()));
}

TEST(GpuRope, RotationIsTheCpusBitsInEveryHeadLayout) {
  const RopeParams p{};  // gpt-oss: head_dim 64, theta 150000, YaRN s = 32 over 4096
  for (const DType t : {DType::f32, DType::bf16}) {
    for (const Shape& shape :
         std::vector<Shape>{{37, 8, 64}, {5, 2, 4, 64}, {1, 1, 64}, {0, 8, 64}, {300, 3, 64}}) {
      const std::string what = fmt::format("{} {}", t, shape);
      SCOPED_TRACE(what);
      const RopeTable table = rope_table(p, shape[0], 11, t);
      const Tensor x = random_normal(shape, t, {.seed = 51}, 0.0, 3.0);
      expect_bits(apply_rope(x, table),
                  apply_rope(on_gpu(x), on_gpu(table.cos), on_gpu(table.sin), kStream), what);
    }
  }
}

TEST(GpuRope, QueriesAndKeysAreTheCpusBitsAtEveryOffset) {
  // YaRN (s = 32) and plain RoPE (s = 1), offsets at 0, across the initial context (4096) and
  // far past it (decode at 100000), GQA's k with fewer heads than q.
  for (const double s : {32.0, 1.0}) {
    const RopeParams p{.scaling_factor = s};
    for (const std::int64_t offset : {0, 4090, 100000}) {
      for (const DType t : {DType::f32, DType::bf16}) {
        const std::string what = fmt::format("s {} offset {} {}", s, offset, t);
        SCOPED_TRACE(what);
        const Tensor q = random_normal({13, 8, 64}, t, {.seed = 52}, 0.0, 2.0);
        const Tensor k = random_normal({13, 2, 64}, t, {.seed = 53}, 0.0, 2.0);
        const auto [wq, wk] = meshtest::rope(q, k, p, offset);
        const auto [gq, gk] = gpu::rope(on_gpu(q), on_gpu(k), p, kStream, offset);
        expect_bits(wq, gq, what + " q");
        expect_bits(wk, gk, what + " k");
      }
    }
  }
}

TEST(GpuQkvRope, EveryTokenAtItsOwnPosition) {
  // qkv_rope_at (a batch decode's tokens of several sequences): token i rotated at positions[i]
  // in any order, across YaRN's initial context and past the table's first 4096 rows.
  const std::vector<std::int64_t> positions{4095, 0, 17, 100000, 18, 3};
  const std::int64_t tokens = 6, hidden = 96, heads = 8, kv = 2, d = 64, qkv = (heads + 2 * kv) * d;
  for (const DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(fmt::format("{}", t));
    const Tensor x = random_normal({tokens, hidden}, t, {.seed = 65});
    const Tensor w = random_normal({qkv, hidden}, t, {.seed = 66}, 0.0, 0.1);
    const Tensor b = random_normal({qkv}, t, {.seed = 67});
    const QkvRopeOptions o{.num_heads = heads, .num_kv_heads = kv, .rope = RopeParams{}};
    Blas blas;
    const DeviceQkv got = gpu::qkv_rope_at(blas, on_gpu(x), on_gpu(w), on_gpu(b), o, positions);
    // Token by token: the CPU's rope at its position of the GPU's own Linear row, bit for bit;
    // the whole op against the CPU's qkv_rope of that token alone, within qkv_rope's model.
    const Tensor y = gpu::linear(blas, on_gpu(x), on_gpu(w), on_gpu(b)).to_host();
    const Tensor gq = got.q.to_host(), gk = got.k.to_host(), gv = got.v.to_host();
    const ErrorModel m{.dtype = t, .terms = hidden + 3, .roundings = t == DType::bf16 ? 3 : 0};
    for (std::int64_t i = 0; i < tokens; ++i) {
      const std::int64_t pos = positions[static_cast<std::size_t>(i)];
      const Tensor row = y.slice(0, i, 1);
      const auto [rq, rk] =
          meshtest::rope(row.slice(1, 0, heads * d).reshape({1, kv, heads / kv, d}),
                         row.slice(1, heads * d, kv * d).reshape({1, kv, d}), o.rope, pos);
      EXPECT_TRUE(gq.slice(0, i, 1).bitwise_equal(rq)) << "q of token " << i;
      EXPECT_TRUE(gk.slice(0, i, 1).bitwise_equal(rk)) << "k of token " << i;
      EXPECT_TRUE(gv.slice(0, i, 1).bitwise_equal(
          row.slice(1, (heads + kv) * d, kv * d).reshape({1, kv, d})))
          << "v of token " << i;
      QkvRopeOptions one = o;
      one.position_offset = pos;
      const Qkv want = meshtest::qkv_rope(x.slice(0, i, 1), w, b, one);
      const Comparison cmp = compare(want.q, gq.slice(0, i, 1), m);
      EXPECT_TRUE(cmp.passed) << "token " << i << ": " << cmp;
    }
  }
  Blas blas;
  const DeviceTensor x({2, 32}, DType::f32), w({3 * 64, 32}, DType::f32), b({3 * 64}, DType::f32);
  const QkvRopeOptions o{.num_heads = 1, .num_kv_heads = 1, .rope = {}};
  expect_error([&] { (void)gpu::qkv_rope_at(blas, x, w, b, o, std::vector<std::int64_t>{1}); },
               {"gpu qkv_rope_at: 1 positions for 2 tokens"});
  expect_error(
      [&] {
        (void)gpu::qkv_rope_at(blas, x, w, b, o, std::vector<std::int64_t>{1, -2});
      },
      {"gpu rope_at: position -2 (token 1) is negative"});
  QkvRopeOptions offset = o;
  offset.position_offset = 3;
  expect_error(
      [&] {
        (void)gpu::qkv_rope_at(blas, x, w, b, offset, std::vector<std::int64_t>{1, 2});
      },
      {"gpu qkv_rope_at: position_offset is 3, expected 0 (the positions are given per token)"});
}

TEST(GpuQkvRope, WithinTheLinearsModelAndTheSplitAndRotationExact) {
  struct Case {
    std::int64_t tokens, hidden, heads, kv, offset;
  };
  for (const Case& c : std::vector<Case>{
           {37, 96, 8, 2, 0}, {1, 64, 4, 4, 4095}, {0, 32, 2, 1, 0}, {300, 128, 6, 3, 17}}) {
    for (const DType t : {DType::f32, DType::bf16}) {
      const std::string what = fmt::format("{} T={} hidden={} heads={}/{} offset {}", t, c.tokens,
                                           c.hidden, c.heads, c.kv, c.offset);
      SCOPED_TRACE(what);
      const std::int64_t d = 64, qkv = (c.heads + 2 * c.kv) * d;
      const Tensor x = random_normal({c.tokens, c.hidden}, t, {.seed = 54});
      const Tensor w = random_normal({qkv, c.hidden}, t, {.seed = 55}, 0.0,
                                     1 / std::sqrt(static_cast<double>(c.hidden)));
      const Tensor b = random_normal({qkv}, t, {.seed = 56});
      const QkvRopeOptions o{.num_heads = c.heads,
                             .num_kv_heads = c.kv,
                             .rope = RopeParams{.head_dim = d},
                             .position_offset = c.offset};
      Blas blas;
      const DeviceQkv got = gpu::qkv_rope(blas, on_gpu(x), on_gpu(w), on_gpu(b), o);
      const Qkv want = meshtest::qkv_rope(x, w, b, o);
      // The Linear over hidden and its bias in cuBLASLt's order; bf16 rounds it and RoPE's
      // product and sum.
      const ErrorModel m{.dtype = t, .terms = c.hidden + 3, .roundings = t == DType::bf16 ? 3 : 0};
      for (const auto& [name, g, h] :
           {std::tuple{"q", &got.q, &want.q}, {"k", &got.k, &want.k}, {"v", &got.v, &want.v}}) {
        const Comparison cmp = compare(*h, g->to_host(), m);
        EXPECT_TRUE(cmp.passed) << name << ": " << cmp;
      }
      if (t == DType::bf16) {
        // Against the f32 op on the same (bf16) values: the Linear's rounding, RoPE's table of
        // cos and sin in bf16, its products' and its sum's: 4.
        const auto f32 = [](const Tensor& a) { return a.astype(DType::f32); };
        const Qkv want32 = meshtest::qkv_rope(f32(x), f32(w), f32(b), o);
        const ErrorModel m32{.dtype = t, .terms = c.hidden + 3, .roundings = 4};
        for (const auto& [name, g, h] : {std::tuple{"q", &got.q, &want32.q},
                                         {"k", &got.k, &want32.k},
                                         {"v", &got.v, &want32.v}}) {
          const Comparison cmp = compare(*h, g->to_host(), m32);
          EXPECT_TRUE(cmp.passed) << name << " against f32: " << cmp;
        }
      }
      // The split and the rotation of the GPU's own Linear output: the CPU's bits.
      const Tensor y = gpu::linear(blas, on_gpu(x), on_gpu(w), on_gpu(b)).to_host();
      const Tensor q = y.slice(1, 0, c.heads * d).reshape({c.tokens, c.kv, c.heads / c.kv, d});
      const Tensor k = y.slice(1, c.heads * d, c.kv * d).reshape({c.tokens, c.kv, d});
      const auto [rq, rk] = meshtest::rope(q, k, o.rope, c.offset);
      expect_bits(rq, got.q, what + " q");
      expect_bits(rk, got.k, what + " k");
      expect_bits(y.slice(1, (c.heads + c.kv) * d, c.kv * d).reshape({c.tokens, c.kv, d}), got.v,
                  what + " v");
    }
  }
  Blas blas;
  const DeviceTensor x({4, 32}, DType::f32), w({3 * 64, 32}, DType::f32), b({3 * 64}, DType::f32);
  expect_error(
      [&] { (void)gpu::qkv_rope(blas, x, w, b, {.num_heads = 3, .num_kv_heads = 2, .rope = {}}); },
      {"gpu qkv_rope: num_heads 3 must be a positive multiple of num_kv_heads 2"});
  expect_error(
      [&] { (void)gpu::qkv_rope(blas, x, w, b, {.num_heads = 2, .num_kv_heads = 1, .rope = {}}); },
      {"gpu qkv_rope: weight is", "expected [256, 32] and [256]"});
  expect_error(
      [&] {
        (void)gpu::qkv_rope(blas, x, w, b,
                            {.num_heads = 1, .num_kv_heads = 1, .rope = {}, .position_offset = -1});
      },
      {"position_offset is -1"});
}

struct SdpaCase {
  std::int64_t tq, tk, kv, per, d, window, q_offset, k_offset;
  bool no_sinks = false;  ///< -inf sinks: a row that sees no key gets zeros
  double scale = 0;       ///< 0: the default, 1 / sqrt(head_dim)
};

std::string label(const SdpaCase& c, DType t) {
  return fmt::format("{} q {}x{}x{}x{} k {} window {} offsets {}/{}{} scale {}", t, c.tq, c.kv,
                     c.per, c.d, c.tk, c.window, c.q_offset, c.k_offset,
                     c.no_sinks ? " -inf sinks" : "", c.scale);
}

TEST(GpuSdpaSinks, WithinTheModelOfTheCpuOp) {
  const std::vector<SdpaCase> cases{
      {37, 37, 2, 4, 64, 0, 0, 0},       // prefill, causal, GQA
      {37, 37, 2, 4, 64, 8, 0, 0},       // gpt-oss's even layers: a sliding window
      {1, 300, 2, 4, 64, 128, 299, 0},   // decode against a cache of 300, windowed
      {1, 300, 2, 4, 64, 0, 299, 0},     // decode, the whole cache
      {4, 9, 1, 2, 64, 0, 296, 291},     // a chunk of 4 after a cache window of 9
      {6, 20, 1, 1, 32, 0, 0, 3, true},  // rows 0-2 see no key: zeros with -inf sinks
      {6, 20, 1, 1, 32, 0, 0, 3},        // ... and the sink alone otherwise
      {64, 64, 1, 2, 128, 0, 0, 0},      // head_dim 128
      {19, 19, 8, 2, 8, 4, 0, 0},        // head_dim 8 (the tiny config's), a window of 4
      {0, 10, 2, 2, 64, 0, 0, 0},        // no queries
      // bf16 runs these on tensor cores (16 rows or more, head_dim 64 or 128): tiles of 64
      // rows and keys cut by the window, the first 30 rows seeing no key, a chunk after a cache
      {200, 200, 2, 4, 64, 70, 0, 0},
      {100, 130, 2, 4, 64, 0, 0, 30, true},
      {100, 130, 2, 4, 64, 0, 0, 30},
      {40, 140, 1, 8, 64, 0, 100, 0},
      {80, 80, 2, 2, 128, 33, 0, 0},
      // a negative scale (the kernel folds only a positive one into its exponent)
      {70, 70, 2, 4, 64, 0, 0, 0, false, -0.2}};
  for (const SdpaCase& c : cases) {
    for (const DType t : {DType::f32, DType::bf16}) {
      const std::string what = label(c, t);
      SCOPED_TRACE(what);
      const Tensor q = random_normal({c.tq, c.kv, c.per, c.d}, t, {.seed = 57});
      const Tensor k = random_normal({c.tk, c.kv, c.d}, t, {.seed = 58});
      const Tensor v = random_normal({c.tk, c.kv, c.d}, t, {.seed = 59});
      Tensor sinks = random_normal({c.kv * c.per}, t, {.seed = 60});
      if (c.no_sinks) sinks.fill(-std::numeric_limits<double>::infinity());
      SdpaOptions o{.sliding_window = c.window, .q_offset = c.q_offset, .k_offset = c.k_offset};
      if (c.scale != 0) o.scale = c.scale;
      const Tensor want = meshtest::sdpa_sinks(q, k, v, sinks, o);
      const Tensor got =
          gpu::sdpa_sinks(on_gpu(q), on_gpu(k), on_gpu(v), on_gpu(sinks), kStream, o).to_host();
      // The logits over d, the softmax's sum and the weighted sum over the keys, in another
      // order than the CPU's; bf16 rounds the output once (both compute in f32) and, on tensor
      // cores (src/gpu/attention_kernel.hpp, launch_sdpa_flash), the weights before p·v.
      const ErrorModel m{
          .dtype = t, .terms = c.d + 2 * c.tk + 4, .roundings = t == DType::bf16 ? 2 : 0};
      const Comparison cmp = compare(want, got, m);
      EXPECT_TRUE(cmp.passed) << cmp;
      if (t == DType::bf16) {  // ... and against the f32 op on the same (bf16) values
        const auto f32 = [](const Tensor& a) { return a.astype(DType::f32); };
        const Comparison cmp32 =
            compare(meshtest::sdpa_sinks(f32(q), f32(k), f32(v), f32(sinks), o), got, m);
        EXPECT_TRUE(cmp32.passed) << "against f32: " << cmp32;
      }
      if (c.no_sinks && c.tq > 0) {  // rows 0-2 see no key
        EXPECT_TRUE(got.slice(0, 0, 3).bitwise_equal(Tensor({3, c.kv * c.per * c.d}, t)));
      }
    }
  }
}

TEST(GpuSdpaSinks, APrefillOf8192TokensFitsAndItsLastRowsAreTheCpus) {
  // gpt-oss-20b's heads (8 kv heads of 8 queries, d = 64), bf16, causal over 8192 tokens: no
  // 8192 x 8192 logits anywhere; the last rows (the most keys) against the CPU's decode-shaped
  // call for them alone.
  const std::int64_t t = 8192, kv = 8, per = 8, d = 64;
  const Tensor q = random_normal({t, kv, per, d}, DType::bf16, {.seed = 61});
  const Tensor k = random_normal({t, kv, d}, DType::bf16, {.seed = 62});
  const Tensor v = random_normal({t, kv, d}, DType::bf16, {.seed = 63});
  const Tensor sinks = random_normal({kv * per}, DType::bf16, {.seed = 64});
  const Tensor got =
      gpu::sdpa_sinks(on_gpu(q), on_gpu(k), on_gpu(v), on_gpu(sinks), kStream).to_host();
  ASSERT_EQ(got.shape(), (Shape{t, kv * per * d}));
  const Tensor want = meshtest::sdpa_sinks(q.slice(0, t - 2, 2), k, v, sinks, {.q_offset = t - 2});
  const ErrorModel m{.dtype = DType::bf16, .terms = d + 2 * t + 4, .roundings = 2};  // as above
  const Comparison cmp = compare(want, got.slice(0, t - 2, 2), m);
  EXPECT_TRUE(cmp.passed) << cmp;
}

TEST(GpuSdpaSinks, BadInputIsAnErrorNamingIt) {
  const DeviceTensor q({3, 2, 2, 64}, DType::f32), k({5, 2, 64}, DType::f32);
  const DeviceTensor v({5, 2, 64}, DType::f32), sinks({4}, DType::f32);
  expect_error(
      [&] {
        (void)gpu::sdpa_sinks(DeviceTensor({3, 4, 64}, DType::f32), k, v, sinks, kStream);
      },
      {"gpu sdpa_sinks: q is", "expected [Tq, kv_heads, q_per_kv, head_dim]"});
  expect_error(
      [&] {
        (void)gpu::sdpa_sinks(DeviceTensor({3, 2, 2, 300}, DType::f32), k, v, sinks, kStream);
      },
      {"head_dim is 300, expected 1 .. 256"});
  expect_error(
      [&] {
        (void)gpu::sdpa_sinks(q, DeviceTensor({5, 1, 64}, DType::f32), v, sinks, kStream);
      },
      {"gpu sdpa_sinks: k is", "expected [Tk, 2, 64]"});
  expect_error(
      [&] {
        (void)gpu::sdpa_sinks(q, k, DeviceTensor({6, 2, 64}, DType::f32), sinks, kStream);
      },
      {"gpu sdpa_sinks: v is", "expected k's shape"});
  expect_error([&] { (void)gpu::sdpa_sinks(q, k, v, DeviceTensor({3}, DType::f32), kStream); },
               {"gpu sdpa_sinks: sinks are", "expected [4] (heads)"});
  expect_error([&] { (void)gpu::sdpa_sinks(q, k, v, DeviceTensor({4}, DType::bf16), kStream); },
               {"gpu sdpa_sinks: sinks is", "expected dtype f32"});
  expect_error([&] { (void)gpu::sdpa_sinks(q, k, v, sinks, kStream, {.sliding_window = -1}); },
               {"sliding_window is -1"});
  expect_error(
      [&] {
        (void)gpu::sdpa_sinks(q, k, v, sinks, kStream,
                              {.scale = std::numeric_limits<double>::infinity()});
      },
      {"scale is inf, expected a finite value"});
}

TEST(GpuSdpaSinksBatch, EachSequenceWithinTheModelOfTheCpuOpOnItsOwn) {
  // A batch decode as the model runs it: sequences of 1 to 3 query rows, each over its own keys
  // (a cache's buffer read from key_begin; a key range inside a longer buffer), a window or
  // none, head sizes 8 to 128 and up to 16 queries per kv head (head_dim 6 and 75: one
  // sdpa_sinks per sequence), more sequences than one launch takes.
  struct Seq {
    std::int64_t rows, q_offset, buffer, key_begin, key_end, k_offset;
  };
  struct Case {
    std::int64_t kv, per, d, window;
    std::vector<Seq> seqs;
    double scale = 0;  ///< 0: the default
  };
  std::vector<Seq> many;  // 70 decode steps over caches of 1 .. 415 keys
  for (std::int64_t i = 0; i < 70; ++i) many.push_back({1, i * 6, 415, 0, i * 6 + 1, 0});
  const std::vector<Case> cases{
      {2, 4, 64, 0, {{1, 299, 512, 0, 300, 0}, {3, 40, 64, 0, 43, 0}, {1, 7, 9, 2, 8, 2}}},
      {2, 4, 64, 100, {{1, 299, 512, 200, 300, 200}, {2, 5, 30, 0, 7, 0}}},
      {1, 8, 128, 0, {{1, 1000, 1200, 0, 1001, 0}, {1, 0, 3, 0, 1, 0}}},
      {2, 2, 8, 4, {{1, 9, 12, 6, 10, 6}, {1, 2, 12, 0, 3, 0}}},
      {1, 16, 32, 0, {{2, 33, 40, 0, 35, 0}}},
      {2, 4, 6, 0, {{1, 20, 21, 0, 21, 0}, {2, 3, 5, 0, 5, 0}}},  // head_dim 6, 75: one call each
      {1, 2, 75, 3, {{1, 50, 60, 48, 51, 48}}},
      {8, 8, 64, 0, many},
      {2, 4, 64, 0, {{1, 99, 100, 0, 100, 0}, {2, 40, 64, 0, 42, 0}}, -0.3}};  // scale < 0
  for (const Case& c : cases) {
    for (const DType t : {DType::f32, DType::bf16}) {
      const std::string what = fmt::format("{} kv {} x {} d {} window {}, {} sequences", t, c.kv,
                                           c.per, c.d, c.window, c.seqs.size());
      SCOPED_TRACE(what);
      std::int64_t rows = 0;
      for (const Seq& s : c.seqs) rows += s.rows;
      const Tensor q = random_normal({rows, c.kv, c.per, c.d}, t, {.seed = 77});
      const Tensor sinks = random_normal({c.kv * c.per}, t, {.seed = 78});
      std::vector<Tensor> keys, values;
      std::vector<DeviceTensor> dkeys, dvalues;
      for (std::size_t i = 0; i < c.seqs.size(); ++i) {
        keys.push_back(random_normal({c.seqs[i].buffer, c.kv, c.d}, t, {.seed = 80 + i}));
        values.push_back(random_normal({c.seqs[i].buffer, c.kv, c.d}, t, {.seed = 200 + i}));
        dkeys.push_back(on_gpu(keys.back()));
        dvalues.push_back(on_gpu(values.back()));
      }
      std::vector<SdpaSequence> seqs;
      for (std::size_t i = 0; i < c.seqs.size(); ++i) {
        const Seq& s = c.seqs[i];
        seqs.push_back({.rows = s.rows,
                        .q_offset = s.q_offset,
                        .keys = &dkeys[i],
                        .values = &dvalues[i],
                        .key_begin = s.key_begin,
                        .key_end = s.key_end,
                        .k_offset = s.k_offset});
      }
      SdpaOptions o{.sliding_window = c.window};
      if (c.scale != 0) o.scale = c.scale;
      const Tensor got = sdpa_sinks_batch(on_gpu(q), seqs, on_gpu(sinks), kStream, o).to_host();
      ASSERT_EQ(got.shape(), (Shape{rows, c.kv * c.per * c.d}));
      std::int64_t row = 0;
      for (std::size_t i = 0; i < c.seqs.size(); ++i) {
        const Seq& s = c.seqs[i];
        const std::int64_t n = s.key_end - s.key_begin;
        const Tensor want =
            meshtest::sdpa_sinks(q.slice(0, row, s.rows), keys[i].slice(0, s.key_begin, n),
                                 values[i].slice(0, s.key_begin, n), sinks,
                                 {.sliding_window = c.window,
                                  .q_offset = s.q_offset,
                                  .k_offset = s.k_offset,
                                  .scale = o.scale});
        // As sdpa_sinks: f32 compute, the output rounded once; bf16 at head_dim 64 and 128 on
        // tensor cores (launch_sdpa_batch_flash) also rounds the weights before p·v.
        const ErrorModel m{
            .dtype = t, .terms = c.d + 2 * n + 4, .roundings = t == DType::bf16 ? 2 : 0};
        const Comparison cmp = compare(want, got.slice(0, row, s.rows), m);
        EXPECT_TRUE(cmp.passed) << "sequence " << i << ": " << cmp;
        row += s.rows;
      }
    }
  }
}

TEST(GpuSdpaSinksBatch, BadInputIsAnErrorNamingIt) {
  const DeviceTensor q({3, 2, 2, 64}, DType::f32), k({5, 2, 64}, DType::f32);
  const DeviceTensor v({5, 2, 64}, DType::f32), sinks({4}, DType::f32);
  const DeviceTensor k_bf16({5, 2, 64}, DType::bf16), k_narrow({5, 1, 64}, DType::f32);
  const auto run = [&](std::vector<SdpaSequence> s, const SdpaOptions& o = {}) {
    (void)sdpa_sinks_batch(q, s, sinks, kStream, o);
  };
  const SdpaSequence ok{.rows = 3, .keys = &k, .values = &v, .key_begin = 0, .key_end = 5};
  SdpaSequence bad = ok;
  bad.values = nullptr;
  expect_error([&] { run({bad}); }, {"gpu sdpa_sinks_batch: sequence 0 has no keys or values"});
  bad = ok;
  bad.keys = &k_narrow;
  expect_error([&] { run({bad}); }, {"sequence 0's keys are", "expected [n, 2, 64]"});
  bad = ok;
  bad.keys = &k_bf16;
  bad.values = &k_bf16;
  expect_error([&] { run({bad}); }, {"gpu sdpa_sinks_batch: keys is", "expected dtype f32"});
  bad = ok;
  bad.key_end = 6;
  expect_error([&] { run({bad}); }, {"sequence 0's keys [0, 6) are not within its 5 rows"});
  bad = ok;
  bad.rows = 2;
  expect_error([&] { run({bad}); }, {"the sequences have 2 rows in all, q has 3"});
  expect_error(
      [&] {
        run({ok, {.rows = -1, .keys = &k, .values = &v}});
      },
      {"sequence 1 has -1 rows, expected >= 0"});
  expect_error([&] { run({ok}, {.q_offset = 4}); },
               {"q_offset 4 and k_offset 0 must be 0 (each sequence has its own)"});
  expect_error([&] { run({ok}, {.sliding_window = -2}); }, {"sliding_window is -2"});
}

TEST(GpuKvCache, WritesAndReadsAreTheCpusAndDecodeAttendsThroughIt) {
  for (const DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(fmt::format("{}", t));
    const std::int64_t len = 16, kv = 2, d = 64;
    KvCache cpu(len, kv, d, t);
    DeviceKvCache gpu(len, kv, d, t);
    const auto write = [&](std::vector<std::int64_t> positions, std::uint64_t seed) {
      const auto n = static_cast<std::int64_t>(positions.size());
      const Tensor k = random_normal({n, kv, d}, t, {.seed = seed});
      const Tensor v = random_normal({n, kv, d}, t, {.seed = seed + 100});
      cpu.write(k, v, positions);
      gpu.write(on_gpu(k), on_gpu(v), positions);
    };
    write({0, 1, 2, 3, 4}, 70);  // a prefill
    write({5}, 71);              // a decode step
    write({9, 7}, 72);           // out of order, a gap at 6 and 8
    write({2, 3}, 73);           // an overwrite
    write({}, 74);               // nothing
    expect_bits(cpu.keys(0, len), gpu.keys(0, len), "keys");
    {  // The same rows by write_rows, queued on a stream: rows [1, 3) of a step's k and v.
      const Tensor k = random_normal({4, kv, d}, t, {.seed = 77});
      const Tensor v = random_normal({4, kv, d}, t, {.seed = 78});
      KvCache cpu_rows(len, kv, d, t);
      DeviceKvCache gpu_rows(len, kv, d, t);
      cpu_rows.write(k.slice(0, 1, 2), v.slice(0, 1, 2), std::vector<std::int64_t>{6, 7});
      const DeviceTensor dk = on_gpu(k), dv = on_gpu(v);
      gpu_rows.write_rows(dk, dv, 1, 2, 6, kStream);
      gpu_rows.write_rows(dk, dv, 0, 0, 15, kStream);  // nothing
      ASSERT_EQ(cudaStreamSynchronize(kStream), cudaSuccess);
      expect_bits(cpu_rows.keys(0, len), gpu_rows.keys(0, len), "write_rows keys");
      expect_bits(cpu_rows.values(0, len), gpu_rows.values(0, len), "write_rows values");
      for (std::int64_t p = 0; p < len; ++p) EXPECT_EQ(gpu_rows.written(p), cpu_rows.written(p));
    }
    expect_bits(cpu.values(0, len), gpu.values(0, len), "values");
    expect_bits(cpu.keys(3, 8), gpu.keys(3, 8), "keys [3, 8)");
    EXPECT_EQ(gpu.length(), cpu.length());
    for (std::int64_t p = 0; p < len; ++p) EXPECT_EQ(gpu.written(p), cpu.written(p)) << p;
    EXPECT_EQ(gpu.window_begin(9, 4), cpu.window_begin(9, 4));
    EXPECT_EQ(gpu.window_begin(9, 0), 0);
    // A decode step at position 9 over the window of 4 keys [6, 10), as the model runs it.
    const Tensor q = random_normal({1, kv, 4, d}, t, {.seed = 75});
    const Tensor sinks = random_normal({kv * 4}, t, {.seed = 76});
    const std::int64_t begin = cpu.window_begin(9, 4);
    const SdpaOptions o{.sliding_window = 4, .q_offset = 9, .k_offset = begin};
    const Tensor want =
        meshtest::sdpa_sinks(q, cpu.keys(begin, 10), cpu.values(begin, 10), sinks, o);
    const Tensor got = gpu::sdpa_sinks(on_gpu(q), gpu.keys(begin, 10), gpu.values(begin, 10),
                                       on_gpu(sinks), kStream, o)
                           .to_host();
    const ErrorModel m{.dtype = t, .terms = d + 2 * 4 + 4, .roundings = t == DType::bf16 ? 1 : 0};
    const Comparison cmp = compare(want, got, m);
    EXPECT_TRUE(cmp.passed) << cmp;
    // ... and through the cache's buffers read in place, as the model's batch decode does.
    const SdpaSequence in_place{.rows = 1,
                                .q_offset = 9,
                                .keys = &gpu.key_buffer(),
                                .values = &gpu.value_buffer(),
                                .key_begin = begin,
                                .key_end = 10,
                                .k_offset = begin};
    const Tensor batched = sdpa_sinks_batch(on_gpu(q), std::span(&in_place, 1), on_gpu(sinks),
                                            kStream, {.sliding_window = 4})
                               .to_host();
    const Comparison cmp_batched = compare(want, batched, m);
    EXPECT_TRUE(cmp_batched.passed) << cmp_batched;
  }
  DeviceKvCache cache(4, 1, 32, DType::f32);
  const DeviceTensor one({1, 1, 32}, DType::f32), two({2, 1, 32}, DType::f32);
  expect_error([&] { cache.write(one, one, std::vector<std::int64_t>{4}); },
               {"gpu KvCache::write: position 4 (row 0) is outside [0, 4)"});
  expect_error(
      [&] {
        cache.write(two, two, std::vector<std::int64_t>{1, 1});
      },
      {"gpu KvCache::write: position 1 appears twice in one call (row 1)"});
  expect_error(
      [&] {
        cache.write(two, one, std::vector<std::int64_t>{0, 1});
      },
      {"gpu KvCache::write: k is", "expected f32[2, 1, 32] each"});
  expect_error([&] { cache.write_rows(two, two, 1, 2, 0, kStream); },
               {"gpu KvCache::write_rows: rows [1, 3) are not within k's 2 rows"});
  expect_error([&] { cache.write_rows(two, two, 0, 2, 3, kStream); },
               {"gpu KvCache::write_rows: positions [3, 5) are not within [0, 4)"});
  expect_error([&] { cache.write_rows(two, one, 0, 1, 0, kStream); },
               {"gpu KvCache::write_rows: k is", "expected f32[m, 1, 32] each"});
  expect_error([&] { (void)cache.keys(3, 5); }, {"gpu KvCache::keys: range [3, 5)"});
  expect_error([&] { (void)cache.window_begin(4, 2); },
               {"gpu KvCache::window_begin: position 4 must be in [0, 4)"});
  expect_error([] { DeviceKvCache bad(4, 1, 32, DType::f64); },
               {"gpu KvCache: dtype f64 is not f32 or bf16"});
}

TEST(GpuKvCache, WriteBatchIsEachCachesWriteInOneLaunch) {
  // 70 caches (launches of 64 entries and of 6), each given a run of 0-3 rows of one step's k
  // and v at its own positions, on a stream of its own; rows of 16-byte words (bf16, d 64), of
  // 2-byte ones (bf16, d 3) and of 4-byte ones (f32, d 5). Each cache holds the bits of the CPU
  // cache written the same rows, and the same written positions.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const auto& [t, d] : std::vector<std::pair<DType, std::int64_t>>{
           {DType::bf16, 64}, {DType::bf16, 3}, {DType::f32, 5}}) {
    SCOPED_TRACE(fmt::format("{} head_dim {}", t, d));
    const std::int64_t len = 8, kv = 2, caches = 70;
    const Tensor k = random_normal({3 * caches, kv, d}, t, {.seed = 80});
    const Tensor v = random_normal({3 * caches, kv, d}, t, {.seed = 81});
    std::vector<KvCache> cpu;
    std::vector<DeviceKvCache> gpu;
    cpu.reserve(caches);
    gpu.reserve(caches);  // the entries point into it
    std::vector<KvCacheRows> writes;
    for (std::int64_t c = 0; c < caches; ++c) {
      const std::int64_t n = c % 4, row = 3 * c, first = c % (len - 3);
      std::vector<std::int64_t> positions;
      for (std::int64_t i = 0; i < n; ++i) positions.push_back(first + i);
      cpu.emplace_back(len, kv, d, t).write(k.slice(0, row, n), v.slice(0, row, n), positions);
      writes.push_back(
          {.cache = &gpu.emplace_back(len, kv, d, t), .row = row, .n = n, .first = first});
    }
    const DeviceTensor dk = on_gpu(k), dv = on_gpu(v);
    DeviceKvCache::write_batch(dk, dv, writes, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (std::int64_t c = 0; c < caches; ++c) {
      const auto i = static_cast<std::size_t>(c);
      expect_bits(cpu[i].keys(0, len), gpu[i].keys(0, len), fmt::format("cache {} keys", c));
      expect_bits(cpu[i].values(0, len), gpu[i].values(0, len), fmt::format("cache {} values", c));
      for (std::int64_t p = 0; p < len; ++p) EXPECT_EQ(gpu[i].written(p), cpu[i].written(p));
    }
  }
  {  // One cache twice at positions apart is two writes of it.
    KvCache cpu(4, 1, 32, DType::f32);
    DeviceKvCache gpu(4, 1, 32, DType::f32);
    const Tensor k = random_normal({2, 1, 32}, DType::f32, {.seed = 82});
    cpu.write(k, k, std::vector<std::int64_t>{3, 0});
    const DeviceTensor dk = on_gpu(k);
    const std::vector<KvCacheRows> twice{{&gpu, 0, 1, 3}, {&gpu, 1, 1, 0}};
    DeviceKvCache::write_batch(dk, dk, twice, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_bits(cpu.keys(0, 4), gpu.keys(0, 4), "one cache twice");
    EXPECT_EQ(gpu.length(), 4);
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  DeviceKvCache a(4, 1, 32, DType::f32), b(4, 1, 32, DType::f32), wide(4, 2, 32, DType::f32);
  const DeviceTensor two({2, 1, 32}, DType::f32);
  const auto batch = [&](std::vector<KvCacheRows> w) {
    DeviceKvCache::write_batch(two, two, w, kStream);
  };
  expect_error(
      [&] {
        batch({{&a, 0, 2, 0}, {&b, 0, 2, 0}, {&a, 1, 1, 1}});
      },
      {"gpu KvCache::write_batch (write 2): positions [1, 2) overlap write 0's [0, 2) "
       "of the same cache"});
  expect_error(
      [&] {
        batch({{&a, 0, 1, 0}, {&b, 1, 2, 0}});
      },
      {"gpu KvCache::write_batch (write 1): rows [1, 3) are not within k's 2 rows"});
  expect_error(
      [&] {
        batch({{&a, 0, 1, 0}, {&b, 0, 1, 4}});
      },
      {"gpu KvCache::write_batch (write 1): positions [4, 5) are not within [0, 4)"});
  expect_error(
      [&] {
        batch({{nullptr, 0, 1, 0}});
      },
      {"gpu KvCache::write_batch (write 0): no cache"});
  expect_error(
      [&] {
        batch({{&a, 0, 1, 0}, {&wide, 0, 1, 0}});
      },
      {"gpu KvCache::write_batch (write 1): k is", "expected f32[m, 2, 32] each"});
  EXPECT_FALSE(a.written(0));  // a batch with a bad entry writes nothing
}

TEST(GpuEmbedding, AShardsRowsAreTheCpusBits) {
  // Rows of every width class (a row of 6 bf16 bytes: 2-byte words; 64 f32: 16-byte ones), ids
  // in and out of the shard (zeros there), none; bad ids and shards as the CPU op's Errors.
  for (const auto& [dtype, hidden] : std::vector<std::pair<DType, std::int64_t>>{
           {DType::bf16, 3}, {DType::bf16, 64}, {DType::f32, 5}, {DType::f32, 64}}) {
    SCOPED_TRACE(fmt::format("{} hidden {}", dtype, hidden));
    const Tensor shard = random_normal({10, hidden}, dtype, {.seed = 61});
    const std::vector<std::int64_t> ids{20, 29, 3, 25, 35, 20, 0};  // rows 20 .. 29 here
    const DeviceTensor got = embedding_shard(ids, DeviceTensor::from_host(shard), 20, 40, kStream);
    EXPECT_TRUE(got.to_host().bitwise_equal(meshtest::embedding_shard(ids, shard, 20, 40)));
    EXPECT_EQ(embedding_shard({}, DeviceTensor::from_host(shard), 20, 40, kStream).shape(),
              (Shape{0, hidden}));
  }
  const DeviceTensor shard = DeviceTensor::from_host(random_normal({10, 4}, DType::f32, {}));
  const std::vector<std::int64_t> bad{1, 40};
  expect_error([&] { (void)embedding_shard(bad, shard, 20, 40, kStream); },
               {"embedding: token 40 at position 1 is outside the vocabulary [0, 40)"});
  expect_error([&] { (void)embedding_shard({}, shard, 35, 40, kStream); },
               {"embedding: shard rows [35, 45) are outside the vocabulary [0, 40)"});
}

TEST(GpuRope, BadInputIsAnErrorNamingIt) {
  const RopeTable table = rope_table(RopeParams{}, 4, 0, DType::f32);
  const DeviceTensor cos = on_gpu(table.cos), sin = on_gpu(table.sin);
  expect_error(
      [&] {
        (void)apply_rope(DeviceTensor({4, 2, 62}, DType::f32), cos, sin, kStream);
      },
      {"gpu apply_rope: x is", "expected [T = 4, ..., head_dim = 64]"});
  expect_error(
      [&] {
        (void)apply_rope(DeviceTensor({5, 2, 64}, DType::f32), cos, sin, kStream);
      },
      {"expected [T = 4, ..., head_dim = 64]"});
  expect_error(
      [&] {
        (void)apply_rope(DeviceTensor({4, 2, 64}, DType::bf16), cos, sin, kStream);
      },
      {"gpu apply_rope: cos is", "expected dtype bf16"});
  expect_error(
      [&] {
        (void)apply_rope(DeviceTensor({4, 64}, DType::f32), cos, DeviceTensor({4, 31}, DType::f32),
                         kStream);
      },
      {"the table is cos", "expected two [T, d/2]"});
  expect_error(
      [&] {
        (void)apply_rope(DeviceTensor({4, 2, 64}, DType::f64), on_gpu(table.cos.astype(DType::f64)),
                         on_gpu(table.sin.astype(DType::f64)), kStream);
      },
      {"f32 or bf16 expected"});
  expect_error(
      [&] {
        (void)gpu::rope(DeviceTensor({4, 2, 64}, DType::f32), DeviceTensor({3, 2, 64}, DType::f32),
                        RopeParams{}, kStream);
      },
      {"gpu rope: q", "must have the same number of tokens"});
  expect_error(
      [&] {
        (void)gpu::rope(DeviceTensor({4, 2, 64}, DType::f32), DeviceTensor({4, 2, 64}, DType::bf16),
                        RopeParams{}, kStream);
      },
      {"gpu rope: q is", "but k is"});
  expect_error(
      [&] {
        (void)gpu::rope(DeviceTensor({4, 2, 64}, DType::f32), DeviceTensor({4, 2, 64}, DType::f32),
                        RopeParams{.head_dim = 63}, kStream);
      },
      {"head_dim"});
}

}  // namespace
}  // namespace meshtest::gpu
