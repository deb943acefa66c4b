// qkv_rope (GPU): checks, one Linear on the Blas, the column split (copies of the q, k and v
// columns) and the rotation of q and k.
#include "src/gpu/qkv_rope.hpp"

#include <string_view>

#include "src/gpu/linear.hpp"
#include "src/gpu/rope.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

namespace {

/// qkv_rope's checks, Linear and split; then q and k rotated by rope at o.position_offset or,
/// with `positions`, by rope_at.
DeviceQkv project_and_rotate(std::string_view op, Blas& blas, const DeviceTensor& x,
                             const DeviceTensor& weight, const DeviceTensor& bias,
                             const QkvRopeOptions& o,
                             const std::span<const std::int64_t>* positions) {
  MESHTEST_CHECK(x.rank() == 2, "{}: x is {}, expected [T, hidden]", op, describe(x));
  MESHTEST_CHECK(o.num_heads > 0 && o.num_kv_heads > 0 && o.num_heads % o.num_kv_heads == 0,
                 "{}: num_heads {} must be a positive multiple of num_kv_heads {}", op, o.num_heads,
                 o.num_kv_heads);
  const std::int64_t d = o.rope.head_dim;
  MESHTEST_CHECK(d > 0 && d % 2 == 0, "{}: head_dim is {}, expected a positive even number", op, d);
  MESHTEST_CHECK(o.position_offset >= 0 && (positions == nullptr || o.position_offset == 0),
                 "{}: position_offset is {}, expected {}", op, o.position_offset,
                 positions == nullptr ? ">= 0" : "0 (the positions are given per token)");
  const std::int64_t heads = o.num_heads, kv = o.num_kv_heads, tokens = x.shape()[0];
  const std::int64_t qkv = (heads + 2 * kv) * d;
  MESHTEST_CHECK(weight.shape() == (Shape{qkv, x.shape()[1]}) && bias.shape() == Shape{qkv},
                 "{}: weight is {} and bias {}, expected [{}, {}] and [{}] ((heads {} + 2 kv_heads "
                 "{}) x head_dim {})",
                 op, describe(weight), describe(bias), qkv, x.shape()[1], qkv, heads, kv, d);
  MESHTEST_CHECK(positions == nullptr || static_cast<std::int64_t>(positions->size()) == tokens,
                 "{}: {} positions for {} tokens", op, positions == nullptr ? 0 : positions->size(),
                 tokens);
  check_linear(blas, x, weight, &bias);
  perf::OpScope scope("qkv_rope");
  scope.input(info(x)).attr("heads", heads).attr("kv_heads", kv).attr("offset", o.position_offset);
  const DeviceTensor y = linear(blas, x, weight, bias);
  blas.synchronize();  // the column copies run on the legacy stream (DeviceTensor's rule)
  const DeviceTensor q = y.slice(1, 0, heads * d).reshape(Shape{tokens, kv, heads / kv, d});
  const DeviceTensor k = y.slice(1, heads * d, kv * d).reshape(Shape{tokens, kv, d});
  DeviceQkv out;
  out.v = y.slice(1, (heads + kv) * d, kv * d).reshape(Shape{tokens, kv, d});
  auto [rq, rk] = positions == nullptr ? rope(q, k, o.rope, blas.stream(), o.position_offset)
                                       : rope_at(q, k, o.rope, blas.stream(), *positions);
  blas.synchronize();  // complete when it returns (nothing waits while capturing)
  out.q = std::move(rq);
  out.k = std::move(rk);
  scope.output(info(out.q)).output(info(out.k)).output(info(out.v));
  return out;
}

}  // namespace

DeviceQkv qkv_rope(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                   const DeviceTensor& bias, const QkvRopeOptions& o) {
  return project_and_rotate("gpu qkv_rope", blas, x, weight, bias, o, nullptr);
}

DeviceQkv qkv_rope_at(Blas& blas, const DeviceTensor& x, const DeviceTensor& weight,
                      const DeviceTensor& bias, const QkvRopeOptions& o,
                      std::span<const std::int64_t> positions) {
  return project_and_rotate("gpu qkv_rope_at", blas, x, weight, bias, o, &positions);
}

}  // namespace meshtest::gpu
