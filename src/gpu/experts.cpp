// experts (GPU): the grouped GEMM as one cuBLASLt GEMM per segment, and the experts op as the
// router, the permutation and the GEMMs of this folder in sequence on blas's stream.
#include "src/gpu/experts.hpp"

#include <string_view>
#include <vector>

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
                          const DeviceTensor& mlp2_weight, const DeviceTensor& mlp2_bias) {
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
  MESHTEST_CHECK(mlp2_bias.shape() == (Shape{e, hidden}), "{}: mlp2_bias is {}, expected [{}, {}]",
                 op, describe(mlp2_bias), e, hidden);
  for (const auto& [name, w] : {std::pair{"mlp1_weight", &mlp1_weight},
                                {"mlp1_bias", &mlp1_bias},
                                {"mlp2_weight", &mlp2_weight},
                                {"mlp2_bias", &mlp2_bias}}) {
    check_dtype(op, name, *w, t.dtype());
    check_on_device(op, name, *w, blas.device());
  }
  check_on_device(op, "t", t, blas.device());
}

}  // namespace

DeviceTensor grouped_gemm(Blas& blas, const DeviceTensor& x, std::span<const std::int64_t> offsets,
                          const DeviceTensor& w, const DeviceTensor* bias) {
  constexpr std::string_view op = "gpu grouped_gemm";
  MESHTEST_CHECK(x.rank() == 2, "{}: x is {}, expected [rows, in]", op, describe(x));
  MESHTEST_CHECK(w.rank() == 3 && w.shape()[2] == x.shape()[1],
                 "{}: w is {}, expected [G, out, {}] (x is {})", op, describe(w), x.shape()[1],
                 describe(x));
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", op, describe(x));
  check_dtype(op, "w", w, x.dtype());
  const std::int64_t groups = w.shape()[0], out = w.shape()[1], in = w.shape()[2];
  const std::int64_t rows = x.shape()[0];
  check_offsets(op, offsets, groups, rows);
  if (bias != nullptr) {
    MESHTEST_CHECK(bias->shape() == (Shape{groups, out}), "{}: bias is {}, expected [{}, {}]", op,
                   describe(*bias), groups, out);
    check_dtype(op, "bias", *bias, x.dtype());
    check_on_device(op, "bias", *bias, blas.device());
  }
  check_on_device(op, "x", x, blas.device());
  check_on_device(op, "w", w, blas.device());
  DeviceTensor y(Shape{rows, out}, x.dtype(), StreamOrdered{blas.shared_stream()});
  perf::OpScope scope("grouped_gemm");
  scope.input(info(x)).input(info(w)).attr("groups", groups).attr("bias", bias != nullptr);
  time_on_stream(scope, blas.stream());
  const std::size_t es = dtype_size(x.dtype());
  for (std::int64_t e = 0; e < groups; ++e) {
    const std::int64_t m = offsets[e + 1] - offsets[e];
    if (m == 0) continue;
    blas.gemm_unchecked(x.dtype(), m, out, in, x.bytes() + offsets[e] * in * es,
                        w.bytes() + e * out * in * es,
                        bias != nullptr ? bias->bytes() + e * out * es : nullptr,
                        y.bytes() + offsets[e] * out * es);
  }
  scope.output(info(y)).flops(2.0 * static_cast<double>(rows * in * out));
  return y;
}

DeviceTensor experts_routed(Blas& blas, const DeviceTensor& t, const DeviceRouting& routing,
                            const DeviceTensor& mlp1_weight, const DeviceTensor& mlp1_bias,
                            const DeviceTensor& mlp2_weight, const DeviceTensor& mlp2_bias,
                            const MoeParams& p) {
  constexpr std::string_view op = "gpu experts";
  check_expert_weights(op, blas, t, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias);
  MESHTEST_CHECK(routing.num_tokens == t.shape()[0] && routing.weights.dtype() == t.dtype(),
                 "{}: the routing is for {} tokens of {}, but t is {}", op, routing.num_tokens,
                 routing.weights.dtype(), describe(t));
  const std::int64_t experts_n = mlp1_weight.shape()[0];
  cudaStream_t stream = blas.stream();
  const DevicePermutation perm = make_permutation(routing, experts_n, stream);
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));  // the segment sizes, for the host's GEMMs
  const Tensor offsets_host = perm.offsets.to_host();
  const std::span<const std::int64_t> offsets(offsets_host.data<std::int64_t>(),
                                              static_cast<std::size_t>(experts_n + 1));
  const DeviceTensor rows = permute(t, perm, stream);
  const DeviceTensor h = grouped_gemm(blas, rows, offsets, mlp1_weight, &mlp1_bias);
  const DeviceTensor a = swiglu(h, stream, p.swiglu_alpha, p.swiglu_limit);
  const DeviceTensor y = grouped_gemm(blas, a, offsets, mlp2_weight, &mlp2_bias);
  return unpermute(y, perm, routing.weights, stream);
}

DeviceTensor experts(Blas& blas, const DeviceTensor& t, const DeviceTensor& gate_weight,
                     const DeviceTensor& gate_bias, const DeviceTensor& mlp1_weight,
                     const DeviceTensor& mlp1_bias, const DeviceTensor& mlp2_weight,
                     const DeviceTensor& mlp2_bias, const MoeParams& p) {
  constexpr std::string_view op = "gpu experts";
  check_expert_weights(op, blas, t, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias);
  MESHTEST_CHECK(gate_weight.shape() == (Shape{mlp1_weight.shape()[0], t.shape()[1]}),
                 "{}: gate_weight is {}, expected [{}, {}]", op, describe(gate_weight),
                 mlp1_weight.shape()[0], t.shape()[1]);
  const DeviceTensor logits = linear(blas, t, gate_weight, gate_bias);
  const DeviceRouting r = gate(logits, p.experts_per_token, blas.stream());
  return experts_routed(blas, t, r, mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias, p);
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
