// reduce_kernel: the axis-order reduction kernels, templated on the element type and the
// combine, with 16-byte loads where every buffer allows them, in a grid-stride loop.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "src/core/f16_bits.hpp"
#include "src/gpu/reduce_kernel.hpp"

namespace meshtest::gpu::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2048 / kThreads;  // resident blocks of a full SM

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// IEEE operations that nvcc never contracts or flushes, with x86's NaN results: an operand's
// NaN made quiet (sign and payload kept), else the default NaN with the sign set.
__device__ __forceinline__ float quiet(float x) {
  return __uint_as_float(__float_as_uint(x) | 0x00400000u);
}
__device__ __forceinline__ double quiet(double x) {
  return __longlong_as_double(__double_as_longlong(x) | 0x0008000000000000ll);
}
template <class A>
__device__ __forceinline__ A nan_result(A a, A b) {
  if (isnan(a)) return quiet(a);
  if (isnan(b)) return quiet(b);
  if constexpr (std::is_same_v<A, float>) {
    return __uint_as_float(0xffc00000u);
  } else {
    return __longlong_as_double(static_cast<long long>(0xfff8000000000000ull));
  }
}
__device__ __forceinline__ float add(float a, float b) {
  const float r = __fadd_rn(a, b);
  return isnan(r) ? nan_result(a, b) : r;
}
__device__ __forceinline__ double add(double a, double b) {
  const double r = __dadd_rn(a, b);
  return isnan(r) ? nan_result(a, b) : r;
}
template <class A>
__device__ __forceinline__ A add(A a, A b) {  // unsigned: wraps
  return a + b;
}
__device__ __forceinline__ float divide(float a, std::int64_t p) {
  return isnan(a) ? quiet(a) : __fdiv_rn(a, static_cast<float>(p));
}
__device__ __forceinline__ double divide(double a, std::int64_t p) {
  return isnan(a) ? quiet(a) : __ddiv_rn(a, static_cast<double>(p));
}

template <Combine C, class A>
__device__ __forceinline__ A combine(A acc, A x) {
  if constexpr (C == Combine::sum) {
    return add(acc, x);
  } else if constexpr (C == Combine::max) {
    return acc < x ? x : acc;  // std::max(acc, x): keeps acc when either is NaN or they tie
  } else {
    return x < acc ? x : acc;  // std::min(acc, x)
  }
}

// f16 as the kernels store it: its bits, a type apart from bf16's std::uint16_t.
struct F16 {
  std::uint16_t bits;
};

// Stored type <-> accumulator: bf16 (its bits as std::uint16_t) widens exactly to f32 and
// rounds back to nearest even, any NaN becoming 0x7fc0 or 0xffc0 by its sign; f16 converts with
// the host's code (src/core/f16_bits.hpp): exact widening, one rounding to nearest even.
template <class S, class A>
__device__ __forceinline__ A widen(S x) {
  if constexpr (std::is_same_v<S, std::uint16_t>) {
    return __uint_as_float(static_cast<unsigned>(x) << 16);
  } else if constexpr (std::is_same_v<S, F16>) {
    return __uint_as_float(f16_bits::to_f32(x.bits));
  } else {
    return x;
  }
}
template <class S, class A>
__device__ __forceinline__ S narrow(A x) {
  if constexpr (std::is_same_v<S, std::uint16_t>) {
    const unsigned u = __float_as_uint(x);
    if (isnan(x)) return static_cast<S>((u & 0x80000000u) != 0 ? 0xffc0u : 0x7fc0u);
    return static_cast<S>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  } else if constexpr (std::is_same_v<S, F16>) {
    return F16{f16_bits::from_f32(__float_as_uint(x))};
  } else {
    return x;
  }
}

// Elements [k, k + V) of one pass.
template <class S, class A, Combine C, int V>
__device__ __forceinline__ void reduce_at(const ReducePass& p, std::int64_t k) {
  A acc[V];
  int first = 0;
  if (p.carry != nullptr) {
    const auto c = *reinterpret_cast<const Pack<A, V>*>(static_cast<const A*>(p.carry) + k);
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = c.v[v];
  } else {
    const auto x = *reinterpret_cast<const Pack<S, V>*>(static_cast<const S*>(p.terms[0]) + k);
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = widen<S, A>(x.v[v]);
    first = 1;
  }
#pragma unroll 4
  for (int j = first; j < p.count; ++j) {
    const auto x = *reinterpret_cast<const Pack<S, V>*>(static_cast<const S*>(p.terms[j]) + k);
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = combine<C>(acc[v], widen<S, A>(x.v[v]));
  }
  if (!p.last) {
    Pack<A, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.v[v] = acc[v];
    *reinterpret_cast<Pack<A, V>*>(static_cast<A*>(p.out) + k) = out;
    return;
  }
  if constexpr (std::is_floating_point_v<A>) {
    if (p.divide_by != 0) {
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = divide(acc[v], p.divide_by);
    }
  }
  Pack<S, V> out;
#pragma unroll
  for (int v = 0; v < V; ++v) out.v[v] = narrow<S, A>(acc[v]);
  *reinterpret_cast<Pack<S, V>*>(static_cast<S*>(p.out) + k) = out;
}

// Vectors of V elements from element `head` on (nvec of them), then one element per thread
// for the rest: [0, head) and the tail after the vectors.
template <class S, class A, Combine C, int V>
__global__ void __launch_bounds__(kThreads)
    reduce_pass(const __grid_constant__ ReducePass p, std::int64_t head, std::int64_t nvec) {
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = tid; i < nvec; i += stride) reduce_at<S, A, C, V>(p, head + i * V);
  const std::int64_t tail = head + nvec * V;
  const std::int64_t rest = head + (p.n - tail);
  for (std::int64_t i = tid; i < rest; i += stride) {
    reduce_at<S, A, C, 1>(p, i < head ? i : tail + (i - head));
  }
}

/// Elements before p + k is vector aligned, or -1 when no k is (p not element aligned).
template <class T>
std::int64_t vector_head(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p) % kVectorBytes;
  if (at % sizeof(T) != 0) return -1;
  return static_cast<std::int64_t>((kVectorBytes - at) % kVectorBytes / sizeof(T));
}

/// The first element from which every buffer of the pass is vector aligned (the stored-type
/// ones at 16 bytes, the accumulator-type ones at V accumulators), or -1 when there is none.
template <class S, class A>
std::int64_t common_head(const ReducePass& p) {
  constexpr std::size_t V = kVectorBytes / sizeof(S);
  std::int64_t head = vector_head<S>(p.terms[0]);
  for (int j = 1; j < p.count; ++j) {
    if (vector_head<S>(p.terms[j]) != head) return -1;
  }
  if (p.last && vector_head<S>(p.out) != head) return -1;
  if (head < 0 || head > p.n) return -1;
  const auto aligned = [&](const void* q) {
    return (reinterpret_cast<std::uintptr_t>(q) + static_cast<std::size_t>(head) * sizeof(A)) %
               (V * sizeof(A)) ==
           0;
  };
  if (p.carry != nullptr && !aligned(p.carry)) return -1;
  if (!p.last && !aligned(p.out)) return -1;
  return head;
}

template <class S, class A, Combine C>
cudaError_t launch(const ReducePass& p, cudaStream_t stream) {
  constexpr int V = kVectorBytes / sizeof(S);
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (err != cudaSuccess) return err;
  const std::int64_t head = common_head<S, A>(p);
  const std::int64_t nvec = head >= 0 ? (p.n - head) / V : p.n;
  const std::int64_t items = nvec > 0 ? nvec : 1;
  const auto blocks = static_cast<unsigned>(
      std::min<std::int64_t>((items + kThreads - 1) / kThreads, std::int64_t{sms} * kBlocksPerSm));
  if (head >= 0) {
    reduce_pass<S, A, C, V><<<blocks, kThreads, 0, stream>>>(p, head, nvec);
  } else {
    reduce_pass<S, A, C, 1><<<blocks, kThreads, 0, stream>>>(p, 0, p.n);
  }
  return cudaGetLastError();
}

template <class S, class A>
cudaError_t launch_any(Combine c, const ReducePass& p, cudaStream_t stream) {
  switch (c) {
    case Combine::sum:
      return launch<S, A, Combine::sum>(p, stream);
    case Combine::max:
      return launch<S, A, Combine::max>(p, stream);
    case Combine::min:
      return launch<S, A, Combine::min>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_reduce_pass(Element e, Combine c, const ReducePass& pass, cudaStream_t stream) {
  if (pass.n <= 0) return cudaSuccess;
  switch (e) {
    case Element::f32:
      return launch_any<float, float>(c, pass, stream);
    case Element::f64:
      return launch_any<double, double>(c, pass, stream);
    case Element::bf16:
      return launch_any<std::uint16_t, float>(c, pass, stream);
    case Element::f16:
      return launch_any<F16, float>(c, pass, stream);
    case Element::u32:  // integer sums only
      return c == Combine::sum ? launch<std::uint32_t, std::uint32_t, Combine::sum>(pass, stream)
                               : cudaErrorInvalidValue;
    case Element::u64:
      return c == Combine::sum ? launch<std::uint64_t, std::uint64_t, Combine::sum>(pass, stream)
                               : cudaErrorInvalidValue;
    case Element::i32:  // integer max and min only
      if (c == Combine::max) return launch<std::int32_t, std::int32_t, Combine::max>(pass, stream);
      if (c == Combine::min) return launch<std::int32_t, std::int32_t, Combine::min>(pass, stream);
      return cudaErrorInvalidValue;
    case Element::i64:
      if (c == Combine::max) return launch<std::int64_t, std::int64_t, Combine::max>(pass, stream);
      if (c == Combine::min) return launch<std::int64_t, std::int64_t, Combine::min>(pass, stream);
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

}  // namespace meshtest::gpu::detail
