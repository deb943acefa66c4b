// experts (GPU): the grouped GEMM as one cuBLASLt GEMM per segment, and the experts op as the
// router, the permutation and the GEMMs of this folder in sequence on blas's stream.
#include "src/gpu/experts.hpp"

#include <algorithm>
#include <bit>
#include <string_view>
#include <vector>

#include "src/gpu/capture.hpp"
#include "src/gpu/cublas.hpp"
#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/index_flag.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/moe_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/swiglu.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/ops/mxfp4.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {
namespace {

void check_offsets(std::string_view op, std::span<const std::int64_t> offsets, std::int64_t groups,
                   std::int64_t rows) {
  MESHTEST_CHECK(static_cast<std::int64_t>(offsets.size()) == groups + 1,
                 "{}: {} offsets for {} groups, expected {}", op, offsets.size(), groups,
                 groups + 1);
  MESHTEST_CHECK(offsets.front() == 0 && offsets.back() == rows,
                 "{}: offsets run from {} to {}, expected 0 to {} (x's rows)", op, offsets.front(),
                 offsets.back(), rows);
  for (std::int64_t e = 0; e < groups; ++e) {
    MESHTEST_CHECK(offsets[e] <= offsets[e + 1], "{}: offsets[{}] = {} > offsets[{}] = {}", op, e,
                   offsets[e], e + 1, offsets[e + 1]);
  }
}

void check_expert_weights(std::string_view op, const Blas& blas, const DeviceTensor& t,
                          const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias,
                          const DeviceTensor& mlp2_weight, const DeviceTensor* mlp2_bias) {
  MESHTEST_CHECK(t.rank() == 2, "{}: t is {}, expected [T, hidden]", op, describe(t));
  MESHTEST_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16,
                 "{}: t is {}: f32 or bf16 expected", op, describe(t));
  const std::int64_t hidden = t.shape()[1];
  MESHTEST_CHECK(mlp1_weight.rank() == 3 && mlp1_weight.shape()[2] == hidden &&
                     mlp1_weight.shape()[1] % 2 == 0,
                 "{}: mlp1_weight is {}, expected [E, 2I, {}]", op, describe(mlp1_weight), hidden);
  const std::int64_t e = mlp1_weight.shape()[0], two_i = mlp1_weight.shape()[1];
  MESHTEST_CHECK(mlp1_bias.shape() == (Shape{e, two_i}), "{}: mlp1_bias is {}, expected [{}, {}]",
                 op, describe(mlp1_bias), e, two_i);
  MESHTEST_CHECK(mlp2_weight.shape() == (Shape{e, hidden, two_i / 2}),
                 "{}: mlp2_weight is {}, expected [{}, {}, {}]", op, describe(mlp2_weight), e,
                 hidden, two_i / 2);
  MESHTEST_CHECK(mlp2_bias == nullptr || mlp2_bias->shape() == (Shape{e, hidden}),
                 "{}: mlp2_bias is {}, expected [{}, {}]", op, describe(*mlp2_bias), e, hidden);
  for (const auto& [name, w] : {std::pair{"mlp1_weight", &mlp1_weight},
                                {"mlp1_bias", &mlp1_bias},
                                {"mlp2_weight", &mlp2_weight},
                                {"mlp2_bias", mlp2_bias}}) {
    if (w == nullptr) continue;
    check_dtype(op, name, *w, t.dtype());
    check_on_device(op, name, *w, blas.device());
  }
  check_on_device(op, "t", t, blas.device());
}

/// A routing's slots grouped by expert, with the segments' offsets on the host too (the grouped
/// GEMMs launch one GEMM per segment).
struct Grouped {
  DevicePermutation perm;
  Tensor offsets_host;
  std::span<const std::int64_t> offsets() const {
    return {offsets_host.data<std::int64_t>(), static_cast<std::size_t>(offsets_host.numel())};
  }
};

/// make_permutation, then the offsets back on the host (synchronizing the stream).
Grouped group_by_expert(const DeviceRouting& routing, std::int64_t experts, cudaStream_t stream) {
  Grouped g{.perm = make_permutation(routing, experts, stream), .offsets_host = {}};
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));
  g.offsets_host = g.perm.offsets.to_host();
  return g;
}

/// Row-major C [m, n] = op(A) · op(B) in f32 on `handle`'s stream: A is [m, k] ([k, m] when
/// ta), B is [k, n] ([n, k] when tb). cuBLAS is column-major, where a row-major buffer is its
/// transpose: C^T = op(B)^T · op(A)^T.
void gemm_rows(cublasHandle_t handle, bool ta, bool tb, std::int64_t m, std::int64_t n,
               std::int64_t k, const float* a, const float* b, float* c) {
  if (m == 0 || n == 0) return;
  const float one = 1, zero = 0;
  MESHTEST_CUBLAS_CHECK(cublasGemmEx(
      handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
      static_cast<int>(m), static_cast<int>(k), &one, b, CUDA_R_32F, static_cast<int>(tb ? k : n),
      a, CUDA_R_32F, static_cast<int>(ta ? m : k), &zero, c, CUDA_R_32F, static_cast<int>(n),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/// The backward of a grouped GEMM out = x · W[e]^T per segment: grad_x [rows, in], grad_w
/// [G, out, in] (zero for an empty segment) and grad_b [G, out], f32.
struct GroupedGrads {
  DeviceTensor x, w, bias;
};

GroupedGrads grouped_backward(cublasHandle_t handle, cudaStream_t stream, const DeviceTensor& x,
                              std::span<const std::int64_t> offsets,
                              const DeviceTensor& offsets_dev, const DeviceTensor& w,
                              const DeviceTensor& grad_out) {
  const std::int64_t rows = x.shape()[0], in = x.shape()[1];
  const std::int64_t groups = w.shape()[0], out = w.shape()[1];
  GroupedGrads g{.x = DeviceTensor(Shape{rows, in}, DType::f32),
                 .w = DeviceTensor(w.shape(), DType::f32),
                 .bias = DeviceTensor(Shape{groups, out}, DType::f32, Tensor::Uninitialized{})};
  const auto* xp = reinterpret_cast<const float*>(x.bytes());
  const auto* wp = reinterpret_cast<const float*>(w.bytes());
  const auto* gp = reinterpret_cast<const float*>(grad_out.bytes());
  for (std::int64_t e = 0; e < groups; ++e) {
    const std::int64_t r0 = offsets[e], n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    // grad_x[seg] = g[seg] · W[e]: [n, out] x [out, in].
    gemm_rows(handle, false, false, n, in, out, gp + r0 * out, wp + e * out * in,
              reinterpret_cast<float*>(g.x.bytes()) + r0 * in);
    // grad_w[e] = g[seg]^T · x[seg]: [out, n] x [n, in].
    gemm_rows(handle, true, false, out, in, n, gp + r0 * out, xp + r0 * in,
              reinterpret_cast<float*>(g.w.bytes()) + e * out * in);
  }
  MESHTEST_CUDA_CHECK(detail::launch_segment_column_sums(
      gp, reinterpret_cast<const std::int64_t*>(offsets_dev.bytes()), groups, out,
      reinterpret_cast<float*>(g.bias.bytes()), stream));
  return g;
}

/// grouped_gemm's checks of x, w and bias (the offsets are the caller's).
void check_grouped(std::string_view op, const Blas& blas, const DeviceTensor& x,
                   const DeviceTensor& w, const DeviceTensor* bias) {
  MESHTEST_CHECK(x.rank() == 2, "{}: x is {}, expected [rows, in]", op, describe(x));
  MESHTEST_CHECK(w.rank() == 3 && w.shape()[2] == x.shape()[1],
                 "{}: w is {}, expected [G, out, {}] (x is {})", op, describe(w), x.shape()[1],
                 describe(x));
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", op, describe(x));
  check_dtype(op, "w", w, x.dtype());
  if (bias != nullptr) {
    MESHTEST_CHECK(bias->shape() == (Shape{w.shape()[0], w.shape()[1]}),
                   "{}: bias is {}, expected [{}, {}]", op, describe(*bias), w.shape()[0],
                   w.shape()[1]);
    check_dtype(op, "bias", *bias, x.dtype());
    check_on_device(op, "bias", *bias, blas.device());
  }
  check_on_device(op, "x", x, blas.device());
  check_on_device(op, "w", w, blas.device());
}

/// The chunk rows of the device-offset grouped GEMM: a power of two from 16 to 128, about a
/// quarter of the mean segment (a partial chunk wastes less than a quarter of a mean segment),
/// at most rows (a chunk reads `chunk` rows of x).
std::int64_t chunk_rows(std::int64_t rows, std::int64_t groups) {
  const auto quarter = static_cast<std::uint64_t>(std::max<std::int64_t>(rows / groups / 4, 1));
  const auto c =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::bit_floor(quarter)), 16, 128);
  return std::min(c, rows);
}

const DeviceTensor* bias_or_null(const DeviceTensor& bias) {
  return bias.empty() ? nullptr : &bias;
}

}  // namespace

DeviceTensor grouped_gemm(Blas& blas, const DeviceTensor& x, std::span<const std::int64_t> offsets,
                          const DeviceTensor& w, const DeviceTensor* bias) {
  constexpr std::string_view op = "gpu grouped_gemm";
  check_grouped(op, blas, x, w, bias);
  const std::int64_t groups = w.shape()[0], out = w.shape()[1], in = w.shape()[2];
  const std::int64_t rows = x.shape()[0];
  check_offsets(op, offsets, groups, rows);
  DeviceTensor y(Shape{rows, out}, x.dtype(), StreamOrdered{blas.shared_stream()});
  perf::OpScope scope("grouped_gemm");
  scope.input(info(x)).input(info(w)).attr("groups", groups).attr("bias", bias != nullptr);
  time_on_stream(scope, blas.stream());
  blas.gemm_segments(x.dtype(), offsets, out, in, x.bytes(), w.bytes(),
                     bias != nullptr ? bias->bytes() : nullptr, y.bytes());
  scope.output(info(y)).flops(2.0 * static_cast<double>(rows * in * out));
  return y;
}

DeviceTensor grouped_gemm(Blas& blas, const DeviceTensor& x, const DeviceTensor& offsets,
                          const DeviceTensor& w, const DeviceTensor* bias) {
  constexpr std::string_view op = "gpu grouped_gemm";
  check_grouped(op, blas, x, w, bias);
  const std::int64_t groups = w.shape()[0], out = w.shape()[1], in = w.shape()[2];
  const std::int64_t rows = x.shape()[0];
  MESHTEST_CHECK(offsets.shape() == (Shape{groups + 1}) && offsets.dtype() == DType::i64,
                 "{}: offsets are {}, expected i64 [{}] (w's groups + 1)", op, describe(offsets),
                 groups + 1);
  check_on_device(op, "offsets", offsets, blas.device());
  const cudaStream_t stream = blas.stream();
  DeviceTensor y(Shape{rows, out}, x.dtype(), StreamOrdered{blas.shared_stream()});
  if (rows == 0 || out == 0) return y;
  const std::int64_t chunk = chunk_rows(rows, groups);
  const std::int64_t max_chunks = (rows + chunk - 1) / chunk + groups;
  MESHTEST_CHECK(max_chunks <= 0x7fffffff && out <= 0x7fffffff && in <= 0x7fffffff,
                 "{}: {} chunks of {} x {} exceed cuBLAS's int sizes", op, max_chunks, out, in);
  perf::OpScope scope("grouped_gemm");
  scope.input(info(x)).input(info(w)).attr("groups", groups).attr("bias", bias != nullptr);
  scope.attr("segments", "device").attr("chunk", chunk);
  time_on_stream(scope, stream);
  // The plan: three pointer arrays, the bounds, chunk starts and first rows; the f32 scratch.
  // Allocated and freed in the stream's order: their free waits for nothing.
  const StreamOrdered order{blas.shared_stream()};
  DeviceTensor pointers(Shape{3, max_chunks}, DType::i64, order);
  DeviceTensor plan(Shape{2 * (groups + 1) + max_chunks}, DType::i64, order);
  DeviceTensor scratch(Shape{max_chunks * chunk, out}, DType::f32, order);
  auto* ptr = reinterpret_cast<void**>(pointers.bytes());
  auto* bounds = reinterpret_cast<std::int64_t*>(plan.bytes());
  std::int64_t* chunk_start = bounds + groups + 1;
  std::int64_t* first_row = chunk_start + groups + 1;
  const auto element = static_cast<std::int64_t>(dtype_size(x.dtype()));
  IndexFlag bad_at(stream);
  MESHTEST_CUDA_CHECK(detail::launch_chunk_plan(
      reinterpret_cast<const std::int64_t*>(offsets.bytes()), groups, rows, chunk, max_chunks,
      x.bytes(), in * element, w.bytes(), out * in * element, scratch.bytes(),
      out * static_cast<std::int64_t>(sizeof(float)), const_cast<const void**>(ptr),
      const_cast<const void**>(ptr + max_chunks), ptr + 2 * max_chunks, bounds, chunk_start,
      first_row, bad_at.get(), stream));
  if (in == 0) {
    MESHTEST_CUDA_CHECK(cudaMemsetAsync(scratch.bytes(), 0, scratch.nbytes(), stream));
  } else {
    // Row-major chunk [chunk, out] = x rows [chunk, in] · w_e [out, in]^T: in cuBLAS's column
    // major, C [out, chunk] = op_T(w_e) · op_N(x rows), every leading dimension a row's length.
    const cudaDataType type = x.dtype() == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const float one = 1, zero = 0;
    const auto n = static_cast<int>(out), k = static_cast<int>(in);
    MESHTEST_CUBLAS_CHECK(cublasGemmBatchedEx(
        blas.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, n, static_cast<int>(chunk), k, &one,
        ptr + max_chunks, type, k, ptr, type, k, &zero, ptr + 2 * max_chunks, CUDA_R_32F, n,
        static_cast<int>(max_chunks), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  MESHTEST_CUDA_CHECK(detail::launch_chunk_gather(
      bounds, groups, rows, out, chunk, chunk_start, first_row,
      reinterpret_cast<const float*>(scratch.bytes()), x.dtype() == DType::bf16,
      bias != nullptr ? bias->bytes() : nullptr, y.bytes(), stream));
  scope.output(info(y)).flops(2.0 * static_cast<double>(max_chunks * chunk * in * out));
  if (const unsigned long long bad = bad_at.read(); bad != detail::kNoIndex) {
    throw Error(
        fmt::format("{}: the offsets on the device do not run from 0 to {} (x's rows), "
                    "non-decreasing: the first bad one is offsets[{}]",
                    op, rows, bad));
  }
  return y;
}

DeviceTensor experts_routed(Blas& blas, const DeviceTensor& t, const DeviceRouting& routing,
                            const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias,
                            const DeviceTensor& mlp2_weight, const DeviceTensor& mlp2_bias,
                            const MoeParams& p, Segments segments) {
  constexpr std::string_view op = "gpu experts";
  check_expert_weights(op, blas, t, mlp1_weight, mlp1_bias, mlp2_weight, bias_or_null(mlp2_bias));
  MESHTEST_CHECK(routing.num_tokens == t.shape()[0] && routing.weights.dtype() == t.dtype(),
                 "{}: the routing is for {} tokens of {}, but t is {}", op, routing.num_tokens,
                 routing.weights.dtype(), describe(t));
  const std::int64_t experts_n = mlp1_weight.shape()[0];
  cudaStream_t stream = blas.stream();
  if (segments == Segments::device) {
    const DevicePermutation perm = make_permutation(routing, experts_n, stream);
    const DeviceTensor rows = permute(t, perm, stream);
    const DeviceTensor h = grouped_gemm(blas, rows, perm.offsets, mlp1_weight, &mlp1_bias);
    const DeviceTensor a = swiglu(h, stream, p.swiglu_alpha, p.swiglu_limit);
    const DeviceTensor y =
        grouped_gemm(blas, a, perm.offsets, mlp2_weight, bias_or_null(mlp2_bias));
    return unpermute(y, perm, routing.weights, stream);
  }
  MESHTEST_CHECK(capturing_stream() == nullptr,
                 "{}: Segments::host reads the experts' row counts back to the host, which a CUDA "
                 "graph capture cannot: capture with Segments::device",
                 op);
  const Grouped grouped = group_by_expert(routing, experts_n, stream);
  const DevicePermutation& perm = grouped.perm;
  const std::span<const std::int64_t> offsets = grouped.offsets();
  const DeviceTensor rows = permute(t, perm, stream);
  const DeviceTensor h = grouped_gemm(blas, rows, offsets, mlp1_weight, &mlp1_bias);
  const DeviceTensor a = swiglu(h, stream, p.swiglu_alpha, p.swiglu_limit);
  const DeviceTensor y = grouped_gemm(blas, a, offsets, mlp2_weight, bias_or_null(mlp2_bias));
  return unpermute(y, perm, routing.weights, stream);
}

DeviceTensor experts(Blas& blas, const DeviceTensor& t, const DeviceTensor& gate_weight,
                     const DeviceTensor& gate_bias, const DeviceTensor& mlp1_weight,
                     const DeviceTensor& mlp1_bias, const DeviceTensor& mlp2_weight,
                     const DeviceTensor& mlp2_bias, const MoeParams& p, Segments segments) {
  constexpr std::string_view op = "gpu experts";
  check_expert_weights(op, blas, t, mlp1_weight, mlp1_bias, mlp2_weight, bias_or_null(mlp2_bias));
  MESHTEST_CHECK(gate_weight.shape() == (Shape{mlp1_weight.shape()[0], t.shape()[1]}),
                 "{}: gate_weight is {}, expected [{}, {}]", op, describe(gate_weight),
                 mlp1_weight.shape()[0], t.shape()[1]);
  const DeviceTensor logits = linear(blas, t, gate_weight, gate_bias);
  const DeviceRouting r = gate(logits, p.experts_per_token, blas.stream());
  return experts_routed(blas, t, r, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, p, segments);
}

DeviceMoeGrads moe_backward(Blas& blas, const DeviceTensor& t, const DeviceRouting& routing,
                            const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias,
                            const DeviceTensor& mlp2_weight, const DeviceTensor& mlp2_bias,
                            const DeviceTensor& grad_out, const MoeParams& p) {
  constexpr std::string_view op = "gpu moe_backward";
  check_expert_weights(op, blas, t, mlp1_weight, mlp1_bias, mlp2_weight, &mlp2_bias);
  MESHTEST_CHECK(t.dtype() == DType::f32, "{}: t is {}: f32 expected", op, describe(t));
  const std::int64_t tokens = t.shape()[0], hidden = t.shape()[1];
  MESHTEST_CHECK(grad_out.shape() == t.shape(), "{}: grad_out is {}, expected [{}, {}]", op,
                 describe(grad_out), tokens, hidden);
  check_dtype(op, "grad_out", grad_out, DType::f32);
  MESHTEST_CHECK(
      routing.num_tokens == tokens && routing.weights.shape() == (Shape{tokens, routing.k}),
      "{}: the routing is for {} tokens x k {} (weights {}), but t is {}", op, routing.num_tokens,
      routing.k, describe(routing.weights), describe(t));
  check_dtype(op, "routing.weights", routing.weights, DType::f32);
  const std::int64_t experts_n = mlp1_weight.shape()[0];
  cudaStream_t stream = blas.stream();
  const Grouped grouped = group_by_expert(routing, experts_n, stream);
  const DevicePermutation& perm = grouped.perm;
  const std::span<const std::int64_t> offsets = grouped.offsets();
  perf::OpScope scope("moe_backward");
  scope.input(info(t)).input(info(grad_out)).attr("k", routing.k);
  const DeviceTensor x = permute(t, perm, stream);
  const DeviceTensor grad_rows = permute(grad_out, perm, stream);
  DeviceMoeGrads g = grouped_experts_backward(blas, x, grad_rows, perm, offsets, routing.weights,
                                              mlp1_weight, mlp1_bias, mlp2_weight, &mlp2_bias, p);
  Tensor ones(Shape{tokens, routing.k}, DType::f32);
  ones.fill(1.0);
  g.t = unpermute(g.t, perm, DeviceTensor::from_host(ones), stream);
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the scratch above is freed
  scope.output(info(g.t));
  return g;
}

DeviceMoeGrads grouped_experts_backward(
    Blas& blas, const DeviceTensor& x, const DeviceTensor& grad_rows, const DevicePermutation& perm,
    std::span<const std::int64_t> offsets, const DeviceTensor& weights,
    const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias, const DeviceTensor& mlp2_weight,
    const DeviceTensor* mlp2_bias, const MoeParams& p) {
  constexpr std::string_view op = "gpu grouped_experts_backward";
  check_expert_weights(op, blas, x, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias);
  const std::int64_t rows = perm.rows(), hidden = mlp2_weight.shape()[1];
  const std::int64_t experts_n = mlp1_weight.shape()[0];
  MESHTEST_CHECK(x.shape() == (Shape{rows, hidden}) && grad_rows.shape() == x.shape(),
                 "{}: x is {} and grad_rows {}, expected [{}, {}] (the permutation's rows)", op,
                 describe(x), describe(grad_rows), rows, hidden);
  check_dtype(op, "x", x, DType::f32);
  check_dtype(op, "grad_rows", grad_rows, DType::f32);
  MESHTEST_CHECK(weights.shape() == (Shape{perm.num_tokens, perm.k}) &&
                     weights.dtype() == DType::f32 && perm.num_experts == experts_n,
                 "{}: weights are {} for a permutation of {} tokens x k {} over {} experts, "
                 "expected f32 [{}, {}] and {} experts (the weights')",
                 op, describe(weights), perm.num_tokens, perm.k, perm.num_experts, perm.num_tokens,
                 perm.k, experts_n);
  check_offsets(op, offsets, experts_n, rows);
  cudaStream_t stream = blas.stream();
  // The forward again on the rows grouped by expert: h = W1 x + b1, a = swiglu(h), y = W2 a.
  const DeviceTensor h = grouped_gemm(blas, x, offsets, mlp1_weight, &mlp1_bias);
  const DeviceTensor a = swiglu(h, stream, p.swiglu_alpha, p.swiglu_limit);
  const DeviceTensor y = grouped_gemm(blas, a, offsets, mlp2_weight);
  DeviceMoeGrads g;
  g.weights = DeviceTensor(weights.shape(), DType::f32);  // zero where a slot has no row
  DeviceTensor dy(y.shape(), DType::f32, Tensor::Uninitialized{});
  const auto* offsets_dev = reinterpret_cast<const std::int64_t*>(perm.offsets.bytes());
  MESHTEST_CUDA_CHECK(detail::launch_slot_terms(
      reinterpret_cast<const std::int64_t*>(perm.slots.bytes()), offsets_dev, experts_n, rows,
      hidden, reinterpret_cast<const float*>(grad_rows.bytes()),
      reinterpret_cast<const float*>(y.bytes()),
      mlp2_bias != nullptr ? reinterpret_cast<const float*>(mlp2_bias->bytes()) : nullptr,
      reinterpret_cast<const float*>(weights.bytes()), reinterpret_cast<float*>(g.weights.bytes()),
      reinterpret_cast<float*>(dy.bytes()), stream));
  cublasHandle_t handle = blas.cublas();  // on blas's stream
  GroupedGrads g2 = grouped_backward(handle, stream, a, offsets, perm.offsets, mlp2_weight, dy);
  DeviceTensor dh(h.shape(), DType::f32, Tensor::Uninitialized{});
  MESHTEST_CUDA_CHECK(detail::launch_swiglu_backward(
      reinterpret_cast<const float*>(h.bytes()), reinterpret_cast<const float*>(g2.x.bytes()),
      reinterpret_cast<float*>(dh.bytes()), g2.x.numel(), static_cast<float>(p.swiglu_alpha),
      static_cast<float>(p.swiglu_limit), stream));
  GroupedGrads g1 = grouped_backward(handle, stream, x, offsets, perm.offsets, mlp1_weight, dh);
  // The scratch (h, a, y, dy, dh, g2.x) is cudaMalloc'd: its free waits for the device.
  g.t = std::move(g1.x);
  g.mlp1_weight = std::move(g1.w);
  g.mlp1_bias = std::move(g1.bias);
  g.mlp2_weight = std::move(g2.w);
  g.mlp2_bias = std::move(g2.bias);
  return g;
}

DeviceTensor mxfp4_decode(const DeviceTensor& blocks, const DeviceTensor& scales, DType out,
                          cudaStream_t stream) {
  constexpr std::string_view op = "gpu mxfp4_decode";
  check_mxfp4(blocks.shape(), blocks.dtype(), scales.shape(), scales.dtype(), op);
  using detail::DecodedFloat;
  const DecodedFloat t =
      out == DType::f32    ? DecodedFloat::f32
      : out == DType::f64  ? DecodedFloat::f64
      : out == DType::bf16 ? DecodedFloat::bf16
      : out == DType::f16
          ? DecodedFloat::f16
          : throw Error(fmt::format("{}: output dtype {} is not bf16, f16, f32 or f64", op, out));
  const DeviceGuard guard(blocks.empty() ? current_device() : blocks.device());
  DeviceTensor y(mxfp4_decoded_shape(blocks.shape()), out, Tensor::Uninitialized{});
  perf::OpScope scope("mxfp4_decode");
  scope.input(info(blocks)).input(info(scales));
  time_on_stream(scope, stream);
  MESHTEST_CUDA_CHECK(detail::launch_mxfp4_decode(
      reinterpret_cast<const std::uint8_t*>(blocks.bytes()),
      reinterpret_cast<const std::uint8_t*>(scales.bytes()), scales.numel(), t, y.bytes(), stream));
  scope.output(info(y)).flops(static_cast<double>(y.numel()));
  return y;
}

}  // namespace meshtest::gpu
