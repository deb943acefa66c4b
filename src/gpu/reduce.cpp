// reduce_terms: checks, the dtype and operator dispatch, and passes of at most
// kMaxTermsPerPass terms chained through an accumulator buffer.
#include "src/gpu/reduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "src/gpu/reduce_kernel.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {
namespace {

using detail::Combine;
using detail::Element;

Element element_of(DType t, Combine c) {
  switch (t) {
    case DType::f32:
      return Element::f32;
    case DType::f64:
      return Element::f64;
    case DType::bf16:
      return Element::bf16;
    case DType::f16:
      return Element::f16;
    case DType::i32:
      return c == Combine::sum ? Element::u32 : Element::i32;
    case DType::i64:
      return c == Combine::sum ? Element::u64 : Element::i64;
    case DType::u8:
      break;
  }
  fail("reduce_terms: dtype {} cannot be reduced", t);
}

/// Bytes of the accumulator of one element of t.
std::size_t accumulator_size(DType t) { return widens_to_f32(t) ? 4 : dtype_size(t); }

/// The accumulator buffer of a reduction in several passes, freed in stream order.
class Carry {
 public:
  Carry(std::int64_t n, DType t, const std::byte* dst, cudaStream_t stream) : stream_(stream) {
    // Laid out so that its element k is vector aligned exactly when dst's is (reduce_kernel.hpp):
    // as many accumulators before it as dst has elements past a 16-byte boundary.
    const std::size_t e = dtype_size(t), a = accumulator_size(t);
    const std::size_t shift = reinterpret_cast<std::uintptr_t>(dst) % detail::kVectorBytes / e;
    const std::size_t bytes = (static_cast<std::size_t>(n) + shift) * a;
    MESHTEST_CUDA_CHECK(cudaMallocAsync(&base_, bytes, stream));
    at_ = static_cast<std::byte*>(base_) + shift * a;
  }
  ~Carry() { (void)cudaFreeAsync(base_, stream_); }
  Carry(const Carry&) = delete;
  Carry& operator=(const Carry&) = delete;
  std::byte* get() const { return at_; }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  std::byte* at_ = nullptr;
};

}  // namespace

void reduce_terms(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
                  Reduce op, cudaStream_t stream) {
  MESHTEST_CHECK(n >= 0, "reduce_terms: n = {} elements", n);
  MESHTEST_CHECK(!terms.empty(), "reduce_terms: no terms");
  MESHTEST_CHECK(t != DType::u8, "reduce_terms: dtype {} cannot be reduced", t);
  MESHTEST_CHECK(op != Reduce::avg || is_floating(t),
                 "reduce_terms: avg needs a floating dtype (f32, f64, bf16, f16), not {}", t);
  if (n == 0) return;
  const std::size_t e = dtype_size(t);
  // The name is formatted only when a check fails: this runs on every call.
  const auto name = [](std::ptrdiff_t j) {
    return j < 0 ? std::string("dst") : fmt::format("term {}", j);
  };
  const auto check_pointer = [&](const std::byte* p, std::ptrdiff_t j) {
    MESHTEST_CHECK(p != nullptr, "reduce_terms: {} is null", name(j));
    MESHTEST_CHECK(reinterpret_cast<std::uintptr_t>(p) % e == 0,
                   "reduce_terms: {} at {} is not aligned to its {}-byte {} elements", name(j),
                   static_cast<const void*>(p), e, t);
  };
  check_pointer(dst, -1);
  for (std::size_t j = 0; j < terms.size(); ++j) {
    check_pointer(terms[j], static_cast<std::ptrdiff_t>(j));
  }

  const Combine c = op == Reduce::max   ? Combine::max
                    : op == Reduce::min ? Combine::min
                                        : Combine::sum;
  const Element element = element_of(t, c);
  const auto p = static_cast<std::int64_t>(terms.size());
  const std::int64_t passes = (p + detail::kMaxTermsPerPass - 1) / detail::kMaxTermsPerPass;
  std::optional<Carry> carry;
  if (passes > 1) carry.emplace(n, t, dst, stream);
  for (std::int64_t pass = 0; pass < passes; ++pass) {
    detail::ReducePass rp;
    const std::int64_t from = pass * detail::kMaxTermsPerPass;
    rp.count = static_cast<int>(std::min<std::int64_t>(detail::kMaxTermsPerPass, p - from));
    std::copy_n(terms.begin() + from, rp.count, rp.terms);
    rp.carry = pass > 0 ? carry->get() : nullptr;
    rp.last = pass == passes - 1;
    rp.out = rp.last ? static_cast<void*>(dst) : carry->get();
    rp.divide_by = op == Reduce::avg ? p : 0;
    rp.n = n;
    MESHTEST_CUDA_CHECK(detail::launch_reduce_pass(element, c, rp, stream));
  }
}

}  // namespace meshtest::gpu
