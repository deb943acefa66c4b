// moe_cuda (bench/moe_tables.hpp): table (a) of meshtest-bench moe on rank 0's GPU,
// gpu::grouped_gemm in its two forms (offsets on the host: one cuBLASLt GEMM per non-empty
// expert; offsets on the device: one batched cuBLAS GEMM over chunks, capturable) against one
// dense cuBLASLt GEMM of the same FLOPs. Tables (b) and (c) on GPU ranks: moe_ep_cuda.cpp.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench/moe_tables.hpp"
#include "src/core/random.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/experts.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::bench {
namespace moe_cuda {

constexpr double kGpuGemmTarget = 1.25;  // the target: grouped time <= 1.25 x dense

/// Milliseconds between two events recorded around `work` on `stream`.
template <class Work>
double timed_ms(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, Work&& work) {
  MESHTEST_CUDA_CHECK(cudaEventRecord(start, stream));
  work();
  MESHTEST_CUDA_CHECK(cudaEventRecord(stop, stream));
  MESHTEST_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  MESHTEST_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace moe_cuda

nlohmann::json gemm_table_cuda(const MoeBenchOptions& o, Verdicts& v) {
  using moe_cuda::kGpuGemmTarget;
  const DType dtype = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  fmt::print(
      "\n(a) grouped GEMM on cuda:{} (gpu::grouped_gemm, {}, f32 accumulation; host offsets: one "
      "cuBLASLt GEMM per expert with rows; device offsets: one cublasGemmBatchedEx over chunks "
      "of equal rows, no synchronization, capturable) against one dense cuBLASLt GEMM of the "
      "same FLOPs (C[rows, out] = A[rows, in] · B[out, in]ᵀ); CUDA events on the stream, "
      "median of {} interleaved calls after {} warm-up; TFLOP/s = 2·rows·in·out / time; used = "
      "experts with rows; ratio = grouped / dense time, the target (<= {}) on the faster form\n",
      gpu::current_device(), o.dtype, o.iters, o.warmup, kGpuGemmTarget);
  fmt::print(
      "{:>6} {:>6} {:>6} {:>4}  {:<10} {:>4} {:>7} {:>10} {:>8} {:>10} {:>8} {:>10} {:>8} "
      "{:>6} {:>6}  {}\n",
      "rows", "in", "out", "E", "routing", "used", "largest", "host ms", "TFLOP/s", "device ms",
      "TFLOP/s", "dense ms", "TFLOP/s", "host", "device", "target");
  gpu::Blas blas;
  cudaEvent_t start = nullptr, stop = nullptr;
  MESHTEST_CUDA_CHECK(cudaEventCreate(&start));
  MESHTEST_CUDA_CHECK(cudaEventCreate(&stop));
  nlohmann::json rows = nlohmann::json::array();
  GemmTally tally;
  for (const GemmSize& g : o.gemms) {
    const auto x = gpu::DeviceTensor::from_host(
        random_uniform(Shape{g.rows, g.in}, dtype, {.seed = o.seed, .stream = 11}, -1, 1));
    const auto w = gpu::DeviceTensor::from_host(random_uniform(
        Shape{g.experts, g.out, g.in}, dtype, {.seed = o.seed, .stream = 12}, -1, 1));
    gpu::DeviceTensor dense(Shape{g.rows, g.out}, dtype);
    const double flops = 2.0 * static_cast<double>(g.rows * g.in) * static_cast<double>(g.out);
    for (const std::string routing : {"uniform", "zipf", "all-to-one"}) {
      const std::vector<std::int64_t> offsets = segment_offsets(routing, g.rows, g.experts);
      const auto device_offsets = gpu::DeviceTensor::from_host(
          Tensor::from_vector(Shape{static_cast<std::int64_t>(offsets.size())}, offsets));
      std::vector<double> grouped_ms, device_ms, dense_ms;
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        const double gm = moe_cuda::timed_ms(blas.stream(), start, stop,
                                             [&] { (void)gpu::grouped_gemm(blas, x, offsets, w); });
        const double vm = moe_cuda::timed_ms(blas.stream(), start, stop, [&] {
          (void)gpu::grouped_gemm(blas, x, device_offsets, w);
        });
        const double dm = moe_cuda::timed_ms(blas.stream(), start, stop, [&] {
          blas.gemm_unchecked(dtype, g.rows, g.out, g.in, x.bytes(), w.bytes(), nullptr,
                              dense.bytes());
        });
        if (it < o.warmup) continue;
        grouped_ms.push_back(gm);
        device_ms.push_back(vm);
        dense_ms.push_back(dm);
      }
      const SegmentUse use = segment_use(offsets);
      const double gs = moe_cuda::median(grouped_ms), ds = moe_cuda::median(dense_ms);
      const double vs = moe_cuda::median(device_ms);
      const double ratio = gs / ds, device_ratio = vs / ds;
      const double best = std::min(ratio, device_ratio);
      const bool ok = tally.add(g, routing, best, best <= kGpuGemmTarget);
      fmt::print(
          "{:>6} {:>6} {:>6} {:>4}  {:<10} {:>4} {:>7} {:>10.3f} {:>8.1f} {:>10.3f} {:>8.1f} "
          "{:>10.3f} {:>8.1f} {:>6.3f} {:>6.3f}  {}\n",
          g.rows, g.in, g.out, g.experts, routing, use.used, use.largest, gs, flops / gs * 1e-9, vs,
          flops / vs * 1e-9, ds, flops / ds * 1e-9, ratio, device_ratio, ok ? "meets" : "misses");
      nlohmann::json row = gemm_row(g, routing, use, gs, ds, ratio);
      row["device_offsets_ms"] = vs;
      row["device_offsets_ratio"] = device_ratio;
      rows.push_back(std::move(row));
    }
  }
  MESHTEST_CUDA_CHECK(cudaEventDestroy(start));
  MESHTEST_CUDA_CHECK(cudaEventDestroy(stop));
  v.lines.push_back(
      fmt::format("grouped GEMM time <= {} x dense ({} on cuda): meets on {} of {} "
                  "rows{}{}",
                  kGpuGemmTarget, o.dtype, tally.meets, tally.total,
                  tally.misses.empty() ? "" : "; misses: ", tally.misses));
  return rows;
}

}  // namespace meshtest::bench
