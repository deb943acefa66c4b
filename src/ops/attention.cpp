// attention: the gpt-oss attention block from linear, rms_norm, rope and sdpa.
#include "src/ops/attention.hpp"

#include "src/ops/compute.hpp"
#include "src/ops/elementwise.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/qkv_rope.hpp"
#include "src/ops/sdpa.hpp"
#include "src/ops/sdpa_sinks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

void check_attention(const AttentionWeights& w, const AttentionParams& p, std::int64_t hidden,
                     DType dtype) {
  constexpr std::string_view op = "attention_block";
  MESHTEST_CHECK(p.num_heads > 0 && p.num_kv_heads > 0 && p.head_dim > 0,
                 "attention_block: num_heads {}, num_kv_heads {} and head_dim {} must be > 0",
                 p.num_heads, p.num_kv_heads, p.head_dim);
  MESHTEST_CHECK(p.num_heads % p.num_kv_heads == 0,
                 "attention_block: num_heads {} is not a multiple of num_kv_heads {}", p.num_heads,
                 p.num_kv_heads);
  MESHTEST_CHECK(p.rope.head_dim == p.head_dim,
                 "attention_block: rope.head_dim {} differs from head_dim {}", p.rope.head_dim,
                 p.head_dim);
  MESHTEST_CHECK(p.sliding_window >= 0, "attention_block: sliding_window is {}, expected >= 0",
                 p.sliding_window);
  const std::int64_t qkv_dim = (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  detail::check_shape(op, "norm.scale", w.norm_scale, Shape{hidden});
  detail::check_shape(op, "qkv.weight", w.qkv_weight, Shape{qkv_dim, hidden});
  detail::check_shape(op, "qkv.bias", w.qkv_bias, Shape{qkv_dim});
  detail::check_shape(op, "sinks", w.sinks, Shape{p.num_heads});
  detail::check_shape(op, "out.weight", w.out_weight, Shape{hidden, p.num_heads * p.head_dim});
  detail::check_shape(op, "out.bias", w.out_bias, Shape{hidden});
  MESHTEST_CHECK(is_floating(w.norm_scale.dtype()),
                 "attention_block: norm.scale has dtype {}, expected f32, f64, bf16 or f16",
                 w.norm_scale.dtype());
  detail::check_dtype(op, "qkv.weight", w.qkv_weight, dtype);
  detail::check_dtype(op, "qkv.bias", w.qkv_bias, dtype);
  detail::check_dtype(op, "sinks", w.sinks, dtype);
  detail::check_dtype(op, "out.weight", w.out_weight, dtype);
  detail::check_dtype(op, "out.bias", w.out_bias, dtype);
}

Qkv split_qkv(const Tensor& qkv, std::int64_t num_heads, std::int64_t num_kv_heads,
              std::int64_t head_dim) {
  MESHTEST_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
                 "split_qkv: num_heads {} must be a positive multiple of num_kv_heads {}",
                 num_heads, num_kv_heads);
  const std::int64_t q_dim = num_heads * head_dim;
  const std::int64_t kv_dim = num_kv_heads * head_dim;
  detail::check_rank("split_qkv", "qkv", qkv, 2);
  const std::int64_t tokens = qkv.shape()[0];
  detail::check_shape("split_qkv", "qkv", qkv, Shape{tokens, q_dim + 2 * kv_dim});
  return {
      qkv.slice(1, 0, q_dim)
          .reshape(Shape{tokens, num_kv_heads, num_heads / num_kv_heads, head_dim}),
      qkv.slice(1, q_dim, kv_dim).reshape(Shape{tokens, num_kv_heads, head_dim}),
      qkv.slice(1, q_dim + kv_dim, kv_dim).reshape(Shape{tokens, num_kv_heads, head_dim}),
  };
}

Qkv attention_qkv(const Tensor& t, const AttentionWeights& w, const AttentionParams& p,
                  std::int64_t offset) {
  if (p.fused) {
    return qkv_rope(t, w.qkv_weight, w.qkv_bias,
                    {.num_heads = p.num_heads,
                     .num_kv_heads = p.num_kv_heads,
                     .rope = p.rope,
                     .position_offset = offset});
  }
  Qkv qkv = split_qkv(linear(t, w.qkv_weight, w.qkv_bias), p.num_heads, p.num_kv_heads, p.head_dim);
  auto [q, k] = rope(qkv.q, qkv.k, p.rope, offset);
  return {std::move(q), std::move(k), std::move(qkv.v)};
}

Tensor attention_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                      const AttentionParams& p, std::int64_t q_offset) {
  const SdpaOptions o{.sliding_window = p.sliding_window, .q_offset = q_offset};
  return p.fused ? sdpa_sinks(q, k, v, sinks, o) : sdpa(q, k, v, sinks, o);
}

Tensor attention_block(const Tensor& x, const AttentionWeights& w, const AttentionParams& p) {
  perf::OpScope scope("attention_block");
  detail::check_rank("attention_block", "x ([T, hidden])", x, 2);
  check_attention(w, p, x.shape()[1], x.dtype());
  const Tensor t = rms_norm(x, w.norm_scale, p.norm_eps);
  const Qkv qkv = attention_qkv(t, w, p);
  const Tensor attn = attention_sdpa(qkv.q, qkv.k, qkv.v, w.sinks, p);
  return add(x, linear(attn, w.out_weight, w.out_bias));
}

}  // namespace meshtest
