// moe_kernel: the MoE router, expert counts, permutation and its inverse on the GPU, f32, f64
// and bf16 (as bits); every sum in a fixed order with explicitly rounded steps (no FMA), so that
// the selection, the permutation and the unpermuted sums are the CPU ops' bits.
#include "src/gpu/moe_kernel.hpp"

#include <cuda_fp16.h>

#include <cstdint>

#include "src/gpu/bf16_device.cuh"
#include "src/gpu/row_words.cuh"

namespace meshtest::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535;

unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b < kMaxBlocks ? b : kMaxBlocks));
}

// A stored type S with its compute type C and the loads, stores and rounded steps of C.
template <class S>
struct Arith {
  using C = S;
  static __device__ __forceinline__ C load(const S* p, std::int64_t i) { return p[i]; }
  static __device__ __forceinline__ void store(S* p, std::int64_t i, C v) { p[i] = v; }
};
template <>
struct Arith<std::uint16_t> {  // bf16 in f32
  using C = float;
  static __device__ __forceinline__ C load(const std::uint16_t* p, std::int64_t i) {
    return widen(p[i]);
  }
  static __device__ __forceinline__ void store(std::uint16_t* p, std::int64_t i, C v) {
    p[i] = narrow(v);
  }
};

__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float exp_of(float a) { return expf(a); }
__device__ __forceinline__ double exp_of(double a) { return exp(a); }

// Whether row t of a [tokens, experts] tensor holds a NaN; its first one's flat index is lowered
// into *nan_at.
template <class S>
__device__ bool row_has_nan(const S* row, std::int64_t t, std::int64_t experts,
                            unsigned long long* nan_at) {
  for (std::int64_t e = 0; e < experts; ++e) {
    if (isnan(Arith<S>::load(row, e))) {
      atomicMin(nan_at, static_cast<unsigned long long>(t * experts + e));
      return true;
    }
  }
  return false;
}

// Σ_e exp(row[e] - max) over e ascending, each step rounded in the compute type.
template <class S>
__device__ typename Arith<S>::C exp_sum(const S* row, std::int64_t experts,
                                        typename Arith<S>::C max) {
  typename Arith<S>::C sum = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    sum = add(sum, exp_of(sub(Arith<S>::load(row, e), max)));
  }
  return sum;
}

template <class S>
__global__ void gate_kernel(const S* logits, std::int64_t tokens, std::int64_t experts,
                            std::int64_t k, bool softmax_first, bool renormalize,
                            std::int64_t* chosen, S* weights, unsigned long long* nan_at) {
  using A = Arith<S>;
  using C = typename A::C;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       t < tokens; t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const S* row = logits + t * experts;
    if (row_has_nan(row, t, experts, nan_at)) continue;
    // The j-th pick is the largest logit after pick j - 1 in the order (value descending,
    // expert ascending), so no flags are kept.
    std::int64_t* mine = chosen + t * k;
    C prev_v = 0;
    std::int64_t prev_e = -1;
    for (std::int64_t j = 0; j < k; ++j) {
      C best_v = 0;
      std::int64_t best_e = -1;
      for (std::int64_t e = 0; e < experts; ++e) {
        const C v = A::load(row, e);
        const bool after = prev_e < 0 || v < prev_v || (v == prev_v && e > prev_e);
        if (after && (best_e < 0 || v > best_v)) {
          best_v = v;
          best_e = e;
        }
      }
      mine[j] = best_e;
      prev_v = best_v;
      prev_e = best_e;
    }
    const C max = A::load(row, mine[0]);
    S* w = weights + t * k;
    if (!softmax_first) {  // softmax over the k chosen logits
      C sum = 0;
      for (std::int64_t j = 0; j < k; ++j) sum = add(sum, exp_of(sub(A::load(row, mine[j]), max)));
      for (std::int64_t j = 0; j < k; ++j) {
        A::store(w, j, div(exp_of(sub(A::load(row, mine[j]), max)), sum));
      }
      continue;
    }
    const C sum = exp_sum(row, experts, max);  // the full row's softmax at the chosen experts
    C picked = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      picked = add(picked, div(exp_of(sub(A::load(row, mine[j]), max)), sum));
    }
    for (std::int64_t j = 0; j < k; ++j) {
      const C p = div(exp_of(sub(A::load(row, mine[j]), max)), sum);
      A::store(w, j, renormalize ? div(p, picked) : p);
    }
  }
}

template <class S>
__global__ void router_probabilities_kernel(const S* logits, std::int64_t tokens,
                                            std::int64_t experts, typename Arith<S>::C* probs,
                                            unsigned long long* nan_at) {
  using A = Arith<S>;
  using C = typename A::C;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       t < tokens; t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const S* row = logits + t * experts;
    if (row_has_nan(row, t, experts, nan_at)) continue;
    C max = A::load(row, 0);
    for (std::int64_t e = 1; e < experts; ++e) max = fmax(max, A::load(row, e));
    const C sum = exp_sum(row, experts, max);
    for (std::int64_t e = 0; e < experts; ++e) {
      probs[t * experts + e] = div(exp_of(sub(A::load(row, e), max)), sum);
    }
  }
}

template <class P>
__global__ void column_means_kernel(const P* probs, std::int64_t tokens, std::int64_t experts,
                                    double* means) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       e < experts; e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double sum = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      sum = __dadd_rn(sum, static_cast<double>(probs[t * experts + e]));
    }
    means[e] = __ddiv_rn(sum, static_cast<double>(tokens));
  }
}

__global__ void expert_counts_kernel(const std::int64_t* chosen, std::int64_t slots_n,
                                     std::int64_t experts, unsigned long long* counts,
                                     unsigned long long* bad_at) {
  for (std::int64_t s = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       s < slots_n; s += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = chosen[s];
    if (e < 0 || e >= experts) {
      atomicMin(bad_at, static_cast<unsigned long long>(s));
    } else {
      atomicAdd(counts + e, 1ULL);
    }
  }
}

__global__ void offsets_kernel(const unsigned long long* counts, std::int64_t experts,
                               std::int64_t* offsets) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  offsets[0] = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    offsets[e + 1] = offsets[e] + static_cast<std::int64_t>(counts[e]);
  }
}

// One block per expert (grid-stride over experts) walks the slots in chunks of kThreads: each
// routed slot's row is the expert's offset, the slots before this chunk and the ones before it
// in the chunk (a ballot per warp, a prefix over the warps).
__global__ void scatter_kernel(const std::int64_t* chosen, std::int64_t slots_n,
                               std::int64_t experts, const std::int64_t* offsets,
                               std::int64_t* slots, std::int64_t* row_of_slot) {
  constexpr int kWarps = kThreads / 32;
  __shared__ int warp_base[kWarps + 1];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  for (std::int64_t e = blockIdx.x; e < experts; e += gridDim.x) {
    std::int64_t placed = 0;
    for (std::int64_t base = 0; base < slots_n; base += kThreads) {
      const std::int64_t s = base + threadIdx.x;
      const bool mine = s < slots_n && chosen[s] == e;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (lane == 0) warp_base[warp + 1] = __popc(ballot);
      __syncthreads();
      if (threadIdx.x == 0) {
        warp_base[0] = 0;
        for (int w = 0; w < kWarps; ++w) warp_base[w + 1] += warp_base[w];
      }
      __syncthreads();
      if (mine) {
        const std::int64_t row =
            offsets[e] + placed + warp_base[warp] + __popc(ballot & ((1u << lane) - 1u));
        slots[row] = s;
        row_of_slot[s] = row;
      }
      placed += warp_base[kWarps];
      __syncthreads();
    }
  }
}

template <class E>
__global__ void gather_rows_kernel(const E* x, const std::int64_t* slots, std::int64_t rows,
                                   std::int64_t k, std::int64_t cols, E* out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const E* src = x + (slots[r] / k) * cols;
    E* dst = out + r * cols;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
  }
}

// One block per token (grid-strided), its threads over the columns.
template <class S>
__global__ void unpermute_kernel(const S* y, const std::int64_t* row_of_slot, const S* weights,
                                 std::int64_t tokens, std::int64_t k, std::int64_t cols, S* out) {
  using A = Arith<S>;
  using C = typename A::C;
  for (std::int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      C acc = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t row = row_of_slot[t * k + j];
        if (row >= 0) acc = add(acc, mul(A::load(weights, t * k + j), A::load(y, row * cols + c)));
      }
      A::store(out, t * cols + c, acc);
    }
  }
}

// The segment (expert) of row i: the last e with offsets[e] <= i (binary search).
__device__ std::int64_t segment_of(const std::int64_t* offsets, std::int64_t experts,
                                   std::int64_t i) {
  std::int64_t lo = 0, hi = experts - 1;
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <class S>
__global__ void capacity_keep_kernel(const std::int64_t* slots, const std::int64_t* offsets,
                                     std::int64_t experts, std::int64_t rows, std::int64_t capacity,
                                     bool lowest_weight, const S* weights, std::uint8_t* keep) {
  using A = Arith<S>;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = segment_of(offsets, experts, i);
    const std::int64_t first = offsets[e], last = offsets[e + 1];
    if (last - first <= capacity) {
      keep[i] = 1;
    } else if (!lowest_weight) {
      keep[i] = i - first < capacity ? 1 : 0;
    } else {  // its rank among the segment's rows by (weight descending, slot ascending)
      const std::int64_t s = slots[i];
      const double w = static_cast<double>(A::load(weights, s));
      std::int64_t rank = 0;
      for (std::int64_t j = first; j < last; ++j) {
        const double v = static_cast<double>(A::load(weights, slots[j]));
        if (v > w || (v == w && slots[j] < s)) ++rank;
      }
      keep[i] = rank < capacity ? 1 : 0;
    }
  }
}

__global__ void capacity_compact_kernel(const std::int64_t* slots, const std::int64_t* offsets,
                                        std::int64_t experts, std::int64_t rows,
                                        const std::uint8_t* keep, const std::int64_t* new_offsets,
                                        std::int64_t* new_slots, std::int64_t* row_of_slot) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (keep[i] == 0) {
      row_of_slot[slots[i]] = -1;
      continue;
    }
    const std::int64_t e = segment_of(offsets, experts, i);
    std::int64_t before = 0;
    for (std::int64_t j = offsets[e]; j < i; ++j) before += keep[j];
    const std::int64_t row = new_offsets[e] + before;
    new_slots[row] = slots[i];
    row_of_slot[slots[i]] = row;
  }
}

template <class S>
__global__ void find_nan_kernel(const S* values, std::int64_t n, unsigned long long* nan_at) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if (isnan(Arith<S>::load(values, i))) atomicMin(nan_at, static_cast<unsigned long long>(i));
  }
}

__constant__ float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// f64 to the decoded type, one rounding to nearest even: every decoded value is exact in f32
// unless it overflows it, so rounding to f32 first changes nothing for bf16 and f16.
struct ToF64 {
  __device__ double operator()(double v) const { return v; }
};
struct ToF32 {
  __device__ float operator()(double v) const { return __double2float_rn(v); }
};
struct ToBf16 {
  __device__ std::uint16_t operator()(double v) const { return narrow(__double2float_rn(v)); }
};
struct ToF16 {
  __device__ std::uint16_t operator()(double v) const {
    return __half_as_ushort(__float2half_rn(__double2float_rn(v)));
  }
};

template <class Out, class Convert>
__global__ void mxfp4_decode_kernel(const std::uint8_t* blocks, const std::uint8_t* scales,
                                    std::int64_t n, Out* out, Convert convert) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint8_t byte = blocks[i / 2];  // 16 bytes = 32 values per block
    const int code = (i % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
    // Exact in f64: |e2m1| <= 6 times 2^(s - 127), s in 0..255.
    out[i] = convert(static_cast<double>(kE2m1[code]) * ldexp(1.0, int{scales[i / 32]} - 127));
  }
}

__global__ void slot_terms_kernel(const std::int64_t* slots, const std::int64_t* offsets,
                                  std::int64_t experts, std::int64_t rows, std::int64_t h,
                                  const float* grad_rows, const float* y, const float* mlp2_bias,
                                  const float* weights, float* grad_weights, float* dy) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = segment_of(offsets, experts, i);
    const std::int64_t s = slots[i];
    const float w = weights[s];
    float dot = 0;
    for (std::int64_t c = 0; c < h; ++c) {
      const float g = grad_rows[i * h + c];
      dot += g * (y[i * h + c] + (mlp2_bias != nullptr ? mlp2_bias[e * h + c] : 0.0f));
      dy[i * h + c] = w * g;
    }
    grad_weights[s] = dot;
  }
}

__global__ void segment_column_sums_kernel(const float* x, const std::int64_t* offsets,
                                           std::int64_t experts, std::int64_t cols, float* sums) {
  const std::int64_t n = experts * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t e = i / cols, c = i % cols;
    float sum = 0;
    for (std::int64_t r = offsets[e]; r < offsets[e + 1]; ++r) sum += x[r * cols + c];
    sums[i] = sum;
  }
}

// One block: thread 0 clamps the offsets into bounds and sums the chunk counts; then every
// thread places chunks c = threadIdx.x, + blockDim.x, ... by a binary search of chunk_start.
__global__ void chunk_plan_kernel(const std::int64_t* offsets, std::int64_t groups,
                                  std::int64_t rows, std::int64_t chunk, std::int64_t max_chunks,
                                  const char* x, std::int64_t x_row_bytes, const char* w,
                                  std::int64_t w_group_bytes, char* scratch,
                                  std::int64_t scratch_row_bytes, const void** x_rows,
                                  const void** w_rows, void** out_rows, std::int64_t* bounds,
                                  std::int64_t* chunk_start, std::int64_t* first_row,
                                  unsigned long long* bad_at) {
  if (threadIdx.x == 0) {
    unsigned long long bad = offsets[0] == 0 ? kNoIndex : 0;
    std::int64_t prev = 0, chunks = 0;
    bounds[0] = 0;
    chunk_start[0] = 0;
    for (std::int64_t e = 0; e < groups; ++e) {
      const std::int64_t o = offsets[e + 1];
      const std::int64_t v = o < prev ? prev : (o > rows ? rows : o);
      if (v != o && bad == kNoIndex) bad = static_cast<unsigned long long>(e + 1);
      chunks += (v - prev + chunk - 1) / chunk;
      bounds[e + 1] = v;
      chunk_start[e + 1] = chunks;
      prev = v;
    }
    if (prev != rows && bad == kNoIndex) bad = static_cast<unsigned long long>(groups);
    if (bad != kNoIndex) atomicMin(bad_at, bad);
  }
  __syncthreads();
  const std::int64_t used = chunk_start[groups];
  for (std::int64_t c = threadIdx.x; c < max_chunks; c += blockDim.x) {
    std::int64_t first = 0, e = 0;
    if (c < used) {
      e = segment_of(chunk_start, groups, c);  // the last e with chunk_start[e] <= c
      const std::int64_t r0 = bounds[e] + (c - chunk_start[e]) * chunk;
      first = r0 < rows - chunk ? r0 : rows - chunk;
    }
    x_rows[c] = x + first * x_row_bytes;
    w_rows[c] = w + e * w_group_bytes;
    out_rows[c] = scratch + c * chunk * scratch_row_bytes;
    first_row[c] = first;
  }
}

// One block per row: its segment by a binary search of bounds, then its columns.
template <class S>
__global__ void chunk_gather_kernel(const std::int64_t* bounds, std::int64_t groups,
                                    std::int64_t cols, std::int64_t chunk,
                                    const std::int64_t* chunk_start, const std::int64_t* first_row,
                                    const float* scratch, const S* bias, S* y) {
  const std::int64_t r = blockIdx.x;
  if (r >= bounds[groups]) return;
  const std::int64_t e = segment_of(bounds, groups, r);  // bounds[e] <= r < bounds[e + 1]
  const std::int64_t c = chunk_start[e] + (r - bounds[e]) / chunk;
  const float* src = scratch + (c * chunk + (r - first_row[c])) * cols;
  for (std::int64_t n = threadIdx.x; n < cols; n += blockDim.x) {
    float v = src[n];
    if (bias != nullptr) v += load(bias, e * cols + n);
    store(y, r * cols + n, v);
  }
}

template <class F>
cudaError_t by_type(RouterFloat t, F&& f) {
  switch (t) {
    case RouterFloat::f32:
      return f(float{});
    case RouterFloat::f64:
      return f(double{});
    case RouterFloat::bf16:
      return f(std::uint16_t{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_gate(RouterFloat t, const void* logits, std::int64_t tokens,
                        std::int64_t experts, std::int64_t k, bool softmax_first, bool renormalize,
                        std::int64_t* chosen, void* weights, unsigned long long* nan_at,
                        cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return by_type(t, [&](auto tag) {
    using S = decltype(tag);
    gate_kernel<S><<<blocks_for(tokens), kThreads, 0, stream>>>(
        static_cast<const S*>(logits), tokens, experts, k, softmax_first, renormalize, chosen,
        static_cast<S*>(weights), nan_at);
    return cudaGetLastError();
  });
}

cudaError_t launch_router_probabilities(RouterFloat t, const void* logits, std::int64_t tokens,
                                        std::int64_t experts, void* probs,
                                        unsigned long long* nan_at, cudaStream_t stream) {
  if (tokens == 0 || experts == 0) return cudaSuccess;
  return by_type(t, [&](auto tag) {
    using S = decltype(tag);
    router_probabilities_kernel<S><<<blocks_for(tokens), kThreads, 0, stream>>>(
        static_cast<const S*>(logits), tokens, experts, static_cast<typename Arith<S>::C*>(probs),
        nan_at);
    return cudaGetLastError();
  });
}

cudaError_t launch_column_means(bool f64, const void* probs, std::int64_t tokens,
                                std::int64_t experts, double* means, cudaStream_t stream) {
  if (tokens == 0 || experts == 0) return cudaSuccess;
  if (f64) {
    column_means_kernel<<<blocks_for(experts), kThreads, 0, stream>>>(
        static_cast<const double*>(probs), tokens, experts, means);
  } else {
    column_means_kernel<<<blocks_for(experts), kThreads, 0, stream>>>(
        static_cast<const float*>(probs), tokens, experts, means);
  }
  return cudaGetLastError();
}

cudaError_t launch_expert_counts(const std::int64_t* chosen, std::int64_t slots_n,
                                 std::int64_t experts, unsigned long long* counts,
                                 unsigned long long* bad_at, cudaStream_t stream) {
  if (slots_n == 0) return cudaSuccess;
  expert_counts_kernel<<<blocks_for(slots_n), kThreads, 0, stream>>>(chosen, slots_n, experts,
                                                                     counts, bad_at);
  return cudaGetLastError();
}

cudaError_t launch_permutation(const std::int64_t* chosen, std::int64_t slots_n,
                               std::int64_t experts, const unsigned long long* counts,
                               std::int64_t* offsets, std::int64_t* slots,
                               std::int64_t* row_of_slot, cudaStream_t stream) {
  offsets_kernel<<<1, 1, 0, stream>>>(counts, experts, offsets);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess || slots_n == 0) return err;
  const unsigned grid = static_cast<unsigned>(experts < kMaxBlocks ? experts : kMaxBlocks);
  scatter_kernel<<<grid, kThreads, 0, stream>>>(chosen, slots_n, experts, offsets, slots,
                                                row_of_slot);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const void* x, const std::int64_t* slots, std::int64_t rows,
                               std::int64_t k, std::int64_t row_bytes, int element_bytes, void* out,
                               cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return cudaSuccess;
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 && element_bytes != 8) {
    return cudaErrorInvalidValue;
  }
  // A copy of bytes, in the widest word that divides a row and both buffers' addresses.
  const unsigned grid = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
  with_row_words(row_bytes, x, out, [&](auto tag) {
    using E = decltype(tag);
    const std::int64_t cols = row_bytes / static_cast<std::int64_t>(sizeof(E));
    gather_rows_kernel<<<grid, row_threads(cols, kThreads), 0, stream>>>(
        static_cast<const E*>(x), slots, rows, k, cols, static_cast<E*>(out));
  });
  return cudaGetLastError();
}

cudaError_t launch_unpermute(RouterFloat t, const void* y, const std::int64_t* row_of_slot,
                             const void* weights, std::int64_t tokens, std::int64_t k,
                             std::int64_t cols, void* out, cudaStream_t stream) {
  if (tokens == 0 || cols == 0) return cudaSuccess;
  return by_type(t, [&](auto tag) {
    using S = decltype(tag);
    const unsigned grid = static_cast<unsigned>(tokens < kMaxBlocks ? tokens : kMaxBlocks);
    unpermute_kernel<S><<<grid, row_threads(cols, kThreads), 0, stream>>>(
        static_cast<const S*>(y), row_of_slot, static_cast<const S*>(weights), tokens, k, cols,
        static_cast<S*>(out));
    return cudaGetLastError();
  });
}

cudaError_t launch_capacity_keep(const std::int64_t* slots, const std::int64_t* offsets,
                                 std::int64_t experts, std::int64_t rows, std::int64_t capacity,
                                 bool lowest_weight, RouterFloat t, const void* weights,
                                 std::uint8_t* keep, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return by_type(t, [&](auto tag) {
    using S = decltype(tag);
    capacity_keep_kernel<S><<<blocks_for(rows), kThreads, 0, stream>>>(
        slots, offsets, experts, rows, capacity, lowest_weight, static_cast<const S*>(weights),
        keep);
    return cudaGetLastError();
  });
}

cudaError_t launch_capacity_compact(const std::int64_t* slots, const std::int64_t* offsets,
                                    std::int64_t experts, std::int64_t rows,
                                    const std::uint8_t* keep, const std::int64_t* new_offsets,
                                    std::int64_t* new_slots, std::int64_t* row_of_slot,
                                    cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  capacity_compact_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(
      slots, offsets, experts, rows, keep, new_offsets, new_slots, row_of_slot);
  return cudaGetLastError();
}

cudaError_t launch_find_nan(RouterFloat t, const void* values, std::int64_t n,
                            unsigned long long* nan_at, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return by_type(t, [&](auto tag) {
    using S = decltype(tag);
    find_nan_kernel<S>
        <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const S*>(values), n, nan_at);
    return cudaGetLastError();
  });
}

cudaError_t launch_mxfp4_decode(const std::uint8_t* blocks, const std::uint8_t* scales,
                                std::int64_t nblocks, DecodedFloat t, void* out,
                                cudaStream_t stream) {
  const std::int64_t n = nblocks * 32;
  if (n == 0) return cudaSuccess;
  const unsigned grid = blocks_for(n);
  switch (t) {
    case DecodedFloat::f64:
      mxfp4_decode_kernel<<<grid, kThreads, 0, stream>>>(blocks, scales, n,
                                                         static_cast<double*>(out), ToF64{});
      break;
    case DecodedFloat::f32:
      mxfp4_decode_kernel<<<grid, kThreads, 0, stream>>>(blocks, scales, n,
                                                         static_cast<float*>(out), ToF32{});
      break;
    case DecodedFloat::bf16:
      mxfp4_decode_kernel<<<grid, kThreads, 0, stream>>>(
          blocks, scales, n, static_cast<std::uint16_t*>(out), ToBf16{});
      break;
    case DecodedFloat::f16:
      mxfp4_decode_kernel<<<grid, kThreads, 0, stream>>>(blocks, scales, n,
                                                         static_cast<std::uint16_t*>(out), ToF16{});
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_slot_terms(const std::int64_t* slots, const std::int64_t* offsets,
                              std::int64_t experts, std::int64_t rows, std::int64_t h,
                              const float* grad_rows, const float* y, const float* mlp2_bias,
                              const float* weights, float* grad_weights, float* dy,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  slot_terms_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(
      slots, offsets, experts, rows, h, grad_rows, y, mlp2_bias, weights, grad_weights, dy);
  return cudaGetLastError();
}

cudaError_t launch_segment_column_sums(const float* x, const std::int64_t* offsets,
                                       std::int64_t experts, std::int64_t cols, float* sums,
                                       cudaStream_t stream) {
  if (experts * cols == 0) return cudaSuccess;
  segment_column_sums_kernel<<<blocks_for(experts * cols), kThreads, 0, stream>>>(
      x, offsets, experts, cols, sums);
  return cudaGetLastError();
}

cudaError_t launch_chunk_plan(const std::int64_t* offsets, std::int64_t groups, std::int64_t rows,
                              std::int64_t chunk, std::int64_t max_chunks, const void* x,
                              std::int64_t x_row_bytes, const void* w, std::int64_t w_group_bytes,
                              void* scratch, std::int64_t scratch_row_bytes, const void** x_rows,
                              const void** w_rows, void** out_rows, std::int64_t* bounds,
                              std::int64_t* chunk_start, std::int64_t* first_row,
                              unsigned long long* bad_at, cudaStream_t stream) {
  if (groups < 1 || chunk < 1 || chunk > rows) return cudaErrorInvalidValue;
  chunk_plan_kernel<<<1, kThreads, 0, stream>>>(
      offsets, groups, rows, chunk, max_chunks, static_cast<const char*>(x), x_row_bytes,
      static_cast<const char*>(w), w_group_bytes, static_cast<char*>(scratch), scratch_row_bytes,
      x_rows, w_rows, out_rows, bounds, chunk_start, first_row, bad_at);
  return cudaGetLastError();
}

cudaError_t launch_chunk_gather(const std::int64_t* bounds, std::int64_t groups, std::int64_t rows,
                                std::int64_t cols, std::int64_t chunk,
                                const std::int64_t* chunk_start, const std::int64_t* first_row,
                                const float* scratch, bool bf16, const void* bias, void* y,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  const auto blocks = static_cast<unsigned>(rows);
  if (bf16) {
    chunk_gather_kernel<<<blocks, kThreads, 0, stream>>>(
        bounds, groups, cols, chunk, chunk_start, first_row, scratch,
        static_cast<const std::uint16_t*>(bias), static_cast<std::uint16_t*>(y));
  } else {
    chunk_gather_kernel<<<blocks, kThreads, 0, stream>>>(
        bounds, groups, cols, chunk, chunk_start, first_row, scratch,
        static_cast<const float*>(bias), static_cast<float*>(y));
  }
  return cudaGetLastError();
}

}  // namespace meshtest::gpu::detail
