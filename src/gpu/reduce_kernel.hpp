// reduce_kernel: what reduce.cpp (checks, dtype dispatch, passes) hands to the kernels of
// reduce_kernel.cu. Plain types only, so that nvcc compiles no Eigen or fmt.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::detail {

/// Stored element type of a pass, which fixes its accumulator: f32, bf16 and f16 accumulate in
/// f32, f64 in f64, u32/u64 (integer sums, wrapping) and i32/i64 (max, min) in themselves.
enum class Element : std::uint8_t { f32, f64, bf16, f16, u32, u64, i32, i64 };

/// How terms are combined; avg is sum with ReducePass::divide_by set on the last pass.
enum class Combine : std::uint8_t { sum, max, min };

/// Terms one kernel launch reads (a kernel parameter array); more take several passes.
inline constexpr int kMaxTermsPerPass = 32;

/// Vector width of the loads and stores, in bytes.
inline constexpr int kVectorBytes = 16;

/// One launch: out[k] = (carry[k] or terms[0][k]) op terms[...][k] ... for k < n.
struct ReducePass {
  /// The accumulator of earlier passes (accumulator type, same element index as dst, laid out
  /// so that its element k is vector aligned when dst's is), or null: terms[0] starts.
  const void* carry = nullptr;
  const void* terms[kMaxTermsPerPass] = {};
  int count = 0;
  /// dst (stored type) on the last pass, else the carry buffer (accumulator type).
  void* out = nullptr;
  bool last = true;
  /// avg on the last pass: the number of terms of all passes; 0: no division.
  std::int64_t divide_by = 0;
  std::int64_t n = 0;
};

/// Queues one pass on `stream` (current device); returns the launch's error.
cudaError_t launch_reduce_pass(Element e, Combine c, const ReducePass& pass, cudaStream_t stream);

}  // namespace meshtest::gpu::detail
