// dp (GPU): the CPU ops' checks, cuBLAS's strided-batched and plain GEMMs on the Blas's stream,
// and the per-sample reductions of dp_kernel.cu.
#include "src/gpu/dp.hpp"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "src/dp/real.hpp"
#include "src/gpu/cublas.hpp"
#include "src/gpu/dp_kernel.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu::dp {
namespace {

using meshtest::dp::SeqDims;

constexpr std::int64_t kScratchBytes = std::int64_t{256} << 20;  // Grams or weight grads a chunk

/// Whether `t` (`what`: "the activations") is f64; an Error unless it is f32 or f64.
bool is_f64(std::string_view op, std::string_view what, const DeviceTensor& t) {
  MESHTEST_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                 "{}: {} are {}: f32 or f64 expected", op, what, describe(t));
  return t.dtype() == DType::f64;
}

/// The checks of an (a, g) pair: the CPU op's, then the device.
std::pair<SeqDims, SeqDims> check_pair(std::string_view op, const Blas& blas, const DeviceTensor& a,
                                       const DeviceTensor& g) {
  meshtest::dp::check_same_samples(op, a.shape(), a.dtype(), g.shape(), g.dtype());
  (void)is_f64(op, "the activations", a);
  check_on_device(op, "a", a, blas.device());
  check_on_device(op, "g", g, blas.device());
  return {meshtest::dp::seq_dims(a.shape(), op, "a"), meshtest::dp::seq_dims(g.shape(), op, "g")};
}

void check_coef(std::string_view op, const Blas& blas, const DeviceTensor& coef, std::int64_t batch,
                DType dtype) {
  MESHTEST_CHECK(coef.shape() == Shape{batch} && coef.dtype() == dtype,
                 "{}: coef is {}, expected {}[{}] (one per sample)", op, describe(coef), dtype,
                 batch);
  check_on_device(op, "coef", coef, blas.device());
}

/// Row-major C[i] [m, n] = X[i] [m, k] · Y[i] [n, k]ᵀ for `batch` samples (strides in elements),
/// or with `trans_x` C[i] = X[i]ᵀ · Y[i] for X[i] [k, m] and Y[i] [k, n]; beta 0 or 1.
void batched_gemm(Blas& blas, bool f64, bool trans_x, std::int64_t m, std::int64_t n,
                  std::int64_t k, const void* x, std::int64_t stride_x, const void* y,
                  std::int64_t stride_y, void* c, std::int64_t stride_c, std::int64_t batch,
                  double beta = 0) {
  if (batch == 0 || m == 0 || n == 0) return;
  // cuBLAS is column-major, where a row-major buffer is its transpose: C computes as Cᵀ [n, m].
  const cudaDataType type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const double one64 = 1, beta64 = beta;
  const float one32 = 1, beta32 = static_cast<float>(beta);
  const void* alpha = f64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* b = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  if (!trans_x) {
    // Cᵀ [n, m] = (Y^{cm} [k, n])ᵀ · X^{cm} [k, m].
    MESHTEST_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(blas.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, i(n), i(m), i(k), alpha,
                                   y, type, i(k), stride_y, x, type, i(k), stride_x, b, c, type,
                                   i(n), stride_c, i(batch), compute, CUBLAS_GEMM_DEFAULT));
  } else {
    // Cᵀ [n, m] = Y^{cm} [n, k] · (X^{cm} [m, k])ᵀ.
    MESHTEST_CUBLAS_CHECK(
        cublasGemmStridedBatchedEx(blas.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, i(n), i(m), i(k), alpha,
                                   y, type, i(n), stride_y, x, type, i(m), stride_x, b, c, type,
                                   i(n), stride_c, i(batch), compute, CUBLAS_GEMM_DEFAULT));
  }
}

/// An output of `finish`'s kind on blas's device (zero-filled with `zero`).
DeviceTensor output(Blas& blas, Shape shape, DType dtype, Finish finish, bool zero = false) {
  if (finish == Finish::complete) {
    return zero ? DeviceTensor(std::move(shape), dtype)
                : DeviceTensor(std::move(shape), dtype, Tensor::Uninitialized{});
  }
  DeviceTensor out(std::move(shape), dtype, StreamOrdered{blas.shared_stream()});
  if (zero && out.nbytes() > 0) {
    MESHTEST_CUDA_CHECK(cudaMemsetAsync(out.bytes(), 0, out.nbytes(), blas.stream()));
  }
  return out;
}

/// Scratch of a call, allocated and freed in the order of blas's stream.
DeviceTensor scratch(Blas& blas, Shape shape, DType dtype) {
  return DeviceTensor(std::move(shape), dtype, StreamOrdered{blas.shared_stream()});
}

/// The end of a call: its work finished, unless it is only queued.
void finish_call(Blas& blas, Finish finish) {
  if (finish == Finish::complete) blas.synchronize();
}

/// Samples per chunk whose scratch of `per_sample` elements of `element` bytes stays within
/// kScratchBytes (at least one).
std::int64_t chunk_of(std::int64_t batch, std::int64_t per_sample, std::int64_t element) {
  const std::int64_t bytes = std::max<std::int64_t>(per_sample * element, 1);
  return std::clamp<std::int64_t>(kScratchBytes / bytes, 1, std::max<std::int64_t>(batch, 1));
}

}  // namespace

DeviceTensor ghost_norm_sq(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                           Finish finish) {
  constexpr std::string_view op = "gpu ghost_norm_sq";
  const auto [da, dg] = check_pair(op, blas, a, g);
  const bool f64 = a.dtype() == DType::f64;
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(a.dtype()));
  const DeviceGuard guard(blas.device());
  DeviceTensor out = output(blas, Shape{da.batch}, a.dtype(), finish);
  perf::OpScope scope("ghost_norm");
  scope.input(info(a)).input(info(g));
  const cudaStream_t stream = blas.stream();
  const std::int64_t t = da.seq;
  if (t == 1) {
    MESHTEST_CUDA_CHECK(detail::launch_row_norm_products(
        f64, a.bytes(), g.bytes(), da.batch, da.features, dg.features, out.bytes(), stream));
  } else {
    const std::int64_t chunk = chunk_of(da.batch, 2 * t * t, esize);
    DeviceTensor grams = scratch(blas, Shape{2, chunk, t, t}, a.dtype());
    std::byte* aa = grams.bytes();
    std::byte* gg = aa + chunk * t * t * esize;
    for (std::int64_t i0 = 0; i0 < da.batch; i0 += chunk) {
      const std::int64_t n = std::min(chunk, da.batch - i0);
      // A_i A_iᵀ and G_i G_iᵀ: [T, d] · [T, d]ᵀ per sample.
      batched_gemm(blas, f64, false, t, t, da.features, a.bytes() + i0 * t * da.features * esize,
                   t * da.features, a.bytes() + i0 * t * da.features * esize, t * da.features, aa,
                   t * t, n);
      batched_gemm(blas, f64, false, t, t, dg.features, g.bytes() + i0 * t * dg.features * esize,
                   t * dg.features, g.bytes() + i0 * t * dg.features * esize, t * dg.features, gg,
                   t * t, n);
      MESHTEST_CUDA_CHECK(detail::launch_sample_dots(f64, aa, gg, n, t * t, false,
                                                     out.bytes() + i0 * esize, stream));
    }
  }
  finish_call(blas, finish);
  const double b = static_cast<double>(da.batch), tt = static_cast<double>(t);
  scope.output(info(out)).flops(2.0 * b * tt * tt * static_cast<double>(da.features + dg.features));
  return out;
}

DeviceTensor direct_norm_sq(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                            DeviceTensor* weight_grad, Finish finish) {
  constexpr std::string_view op = "gpu direct_norm_sq";
  const auto [da, dg] = check_pair(op, blas, a, g);
  if (weight_grad != nullptr) {
    MESHTEST_CHECK(weight_grad->shape() == (Shape{dg.features, da.features}) &&
                       weight_grad->dtype() == a.dtype(),
                   "{}: weight_grad is {}, expected {}[{}, {}]", op, describe(*weight_grad),
                   a.dtype(), dg.features, da.features);
    check_on_device(op, "weight_grad", *weight_grad, blas.device());
  }
  const bool f64 = a.dtype() == DType::f64;
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(a.dtype()));
  const DeviceGuard guard(blas.device());
  DeviceTensor out = output(blas, Shape{da.batch}, a.dtype(), finish);
  perf::OpScope scope(weight_grad != nullptr ? "direct_norm_weight_grad" : "direct_norm");
  scope.input(info(a)).input(info(g));
  const cudaStream_t stream = blas.stream();
  const std::int64_t t = da.seq, w = dg.features * da.features;
  const std::int64_t chunk = chunk_of(da.batch, w, esize);
  DeviceTensor grads = scratch(blas, Shape{chunk, dg.features, da.features}, a.dtype());
  for (std::int64_t i0 = 0; i0 < da.batch; i0 += chunk) {
    const std::int64_t n = std::min(chunk, da.batch - i0);
    // W_i = G_iᵀ A_i: [T, d_out]ᵀ · [T, d_in] per sample.
    batched_gemm(blas, f64, true, dg.features, da.features, t,
                 g.bytes() + i0 * t * dg.features * esize, t * dg.features,
                 a.bytes() + i0 * t * da.features * esize, t * da.features, grads.bytes(), w, n);
    MESHTEST_CUDA_CHECK(detail::launch_sample_dots(f64, grads.bytes(), grads.bytes(), n, w, false,
                                                   out.bytes() + i0 * esize, stream));
  }
  if (weight_grad != nullptr && da.batch > 0) {
    // Σ_i G_iᵀA_i = Gᵀ A over all B·T rows, added into weight_grad.
    batched_gemm(blas, f64, true, dg.features, da.features, da.batch * t, g.bytes(), 0, a.bytes(),
                 0, weight_grad->bytes(), 0, 1, 1.0);
  }
  finish_call(blas, finish);
  const double b = static_cast<double>(da.batch), tt = static_cast<double>(t);
  scope.output(info(out)).flops(2.0 * b * tt * static_cast<double>(w));
  return out;
}

DeviceTensor bias_norm_sq(Blas& blas, const DeviceTensor& g, Finish finish) {
  constexpr std::string_view op = "gpu bias_norm_sq";
  const SeqDims d = meshtest::dp::seq_dims(g.shape(), op, "g");
  const bool f64 = is_f64(op, "the output grads", g);
  check_on_device(op, "g", g, blas.device());
  const DeviceGuard guard(blas.device());
  DeviceTensor out = output(blas, Shape{d.batch}, g.dtype(), finish);
  perf::OpScope scope("bias_norm");
  scope.input(info(g));
  MESHTEST_CUDA_CHECK(detail::launch_bias_norms(f64, g.bytes(), d.batch, d.seq, d.features,
                                                out.bytes(), blas.stream()));
  finish_call(blas, finish);
  scope.output(info(out));
  return out;
}

DeviceTensor clipped_weight_grad(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                                 const DeviceTensor& coef, Finish finish) {
  constexpr std::string_view op = "gpu clipped_weight_grad";
  const auto [da, dg] = check_pair(op, blas, a, g);
  check_coef(op, blas, coef, da.batch, a.dtype());
  const bool f64 = a.dtype() == DType::f64;
  const DeviceGuard guard(blas.device());
  DeviceTensor out =
      output(blas, Shape{dg.features, da.features}, a.dtype(), finish, true);  // zero: no rows
  perf::OpScope scope("clipped_weight_grad");
  scope.input(info(a)).input(info(g)).input(info(coef));
  DeviceTensor scaled = scratch(blas, g.shape(), g.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_scale_samples(f64, g.bytes(), coef.bytes(), dg.batch, dg.seq,
                                                   dg.features, scaled.bytes(), blas.stream()));
  if (da.batch > 0) {
    batched_gemm(blas, f64, true, dg.features, da.features, da.batch * da.seq, scaled.bytes(), 0,
                 a.bytes(), 0, out.bytes(), 0, 1);
  }
  finish_call(blas, finish);
  scope.output(info(out));
  return out;
}

DeviceTensor clipped_bias_grad(Blas& blas, const DeviceTensor& g, const DeviceTensor& coef,
                               Finish finish) {
  constexpr std::string_view op = "gpu clipped_bias_grad";
  const SeqDims d = meshtest::dp::seq_dims(g.shape(), op, "g");
  const bool f64 = is_f64(op, "the output grads", g);
  check_coef(op, blas, coef, d.batch, g.dtype());
  check_on_device(op, "g", g, blas.device());
  const DeviceGuard guard(blas.device());
  DeviceTensor out = output(blas, Shape{d.features}, g.dtype(), finish);
  perf::OpScope scope("clipped_bias_grad");
  scope.input(info(g)).input(info(coef));
  MESHTEST_CUDA_CHECK(detail::launch_clipped_bias(f64, g.bytes(), coef.bytes(), d.batch, d.seq,
                                                  d.features, out.bytes(), blas.stream()));
  finish_call(blas, finish);
  scope.output(info(out));
  return out;
}

DeviceTensor per_sample_weight_grads(Blas& blas, const DeviceTensor& a, const DeviceTensor& g,
                                     Finish finish) {
  constexpr std::string_view op = "gpu per_sample_weight_grads";
  const auto [da, dg] = check_pair(op, blas, a, g);
  const bool f64 = a.dtype() == DType::f64;
  const DeviceGuard guard(blas.device());
  DeviceTensor out =
      output(blas, Shape{da.batch, dg.features, da.features}, a.dtype(), finish, true);
  perf::OpScope scope("per_sample_weight_grads");
  scope.input(info(a)).input(info(g));
  const std::int64_t t = da.seq;
  batched_gemm(blas, f64, true, dg.features, da.features, t, g.bytes(), t * dg.features, a.bytes(),
               t * da.features, out.bytes(), dg.features * da.features, da.batch);
  finish_call(blas, finish);
  scope.output(info(out));
  return out;
}

void gemm(Blas& blas, bool f64, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, const void* a, const void* b, void* c, double beta) {
  if (m == 0 || n == 0) return;
  // Column-major cᵀ [n, m] = op(b)ᵀ · op(a)ᵀ, where a row-major buffer is its transpose.
  const cudaDataType type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const double one64 = 1, beta64 = beta;
  const float one32 = 1, beta32 = static_cast<float>(beta);
  const void* alpha = f64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* bv = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  MESHTEST_CUBLAS_CHECK(cublasGemmEx(blas.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, i(n), i(m), i(k), alpha,
                                     b, type, i(trans_b ? k : n), a, type, i(trans_a ? m : k), bv,
                                     c, type, i(n), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace meshtest::gpu::dp
