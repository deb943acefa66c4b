// blas: a cuBLASLt handle with its stream and workspace, and the one GEMM meshtest's GPU ops use
// (y = x·Wᵀ + b on row-major buffers, f32 accumulation).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "src/core/dtype.hpp"

struct cublasContext;  // cublas_v2.h's handle type (cublasHandle_t)

namespace meshtest::gpu {

class Stream;

/// A cuBLASLt handle on the device current at construction, with its own non-blocking stream
/// (runtime.hpp's Stream) and a 32 MiB workspace. The GPU ops of this folder (linear, swiglu's
/// callers) queue their work on stream(): ops on one Blas run in call order, and their outputs
/// are complete only after synchronize(). Plans (descriptors and the heuristic's algorithm) are
/// cached per shape, so repeated calls cost one cublasLtMatmul. Not thread safe; move-only.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(Blas&& other) noexcept;
  Blas& operator=(Blas&& other) noexcept;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// (The capture's stream while this thread captures a gpu::Graph: graph.hpp.)
  cudaStream_t stream() const;
  /// The Blas's own stream, shared: outputs allocated in its order (StreamOrdered,
  /// device_tensor.hpp) keep it alive after the Blas is gone.
  std::shared_ptr<const Stream> shared_stream() const;
  /// The CUDA ordinal of the device the handle, stream and workspace belong to.
  int device() const;
  /// A cuBLAS handle (cublasHandle_t) of device() on stream(), made on the first call and kept:
  /// for the calls cuBLASLt has no counterpart of (the grouped GEMM, experts.hpp). Its workspace
  /// is the stream's own, so that its calls can be captured in a CUDA graph.
  cublasContext* cublas();
  /// Blocks until everything queued on stream() has finished; throws its error if any.
  /// Nothing while this thread captures a gpu::Graph (the capture's one stream keeps the order).
  void synchronize() const;

  /// Queues y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]) on stream(): row-major, contiguous, dtype
  /// f32 or bf16 for all four; products accumulate in f32 (CUBLAS_COMPUTE_32F: no TF32) and
  /// the bias joins the f32 sum before the one rounding to dtype (the epilogue), as the CPU
  /// linear. bias may be null; k = 0 gives y = bias (or 0); m = 0 or n = 0 queues nothing.
  /// Every pointer must be device memory of device() (checked: an Error names a host or
  /// foreign pointer, "x is host memory, not memory of cuda:0"), y must not overlap the others.
  void gemm(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
            const void* w, const void* bias, void* y);
  /// gemm without the pointer checks (cudaPointerGetAttributes, about 0.2 us each): for callers
  /// whose pointers are DeviceTensors of device() (linear.hpp). The dtype and sizes are still
  /// checked.
  void gemm_unchecked(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
                      const void* w, const void* bias, void* y);
  /// The grouped GEMM's segments (gpu::grouped_gemm, experts.hpp), unchecked as gemm_unchecked:
  /// for every segment e with rows (offsets [G + 1] on the host), y[offsets[e] : offsets[e+1]]
  /// = x[offsets[e] : offsets[e+1]] · w_e[n, k]ᵀ (+ bias_e[n]), where w_e and bias_e are the
  /// e-th of w [G, n, k] and bias [G, n] (bias may be null), x [rows, k] and y [rows, n]. The
  /// segments run on up to four side streams of their own (their own workspaces), forked from
  /// stream() and joined back to it, largest first on the least loaded: small segments fill the
  /// GPU together as one large GEMM does alone. Each segment's result is one cuBLASLt GEMM's, as
  /// gemm_unchecked's. While this thread captures a gpu::Graph they run one after the other on
  /// the capture's stream.
  void gemm_segments(DType dtype, std::span<const std::int64_t> offsets, std::int64_t n,
                     std::int64_t k, const void* x, const void* w, const void* bias, void* y);

 private:
  /// One cuBLASLt GEMM (k > 0) on `on` with `workspace` (kWorkspaceBytes).
  void launch(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
              const void* w, const void* bias, void* y, cudaStream_t on, void* workspace);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtest::gpu
