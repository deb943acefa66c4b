// MXFP4 decode (lookup table + ldexp) and encode (shared exponent, round to nearest even).
#include "src/ops/mxfp4.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

constexpr std::array<double, 8> kE2m1 = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

void check_float_out(DType t, std::string_view what) {
  MESHTEST_CHECK(is_floating(t), "{}: output dtype {} is not bf16, f16, f32 or f64", what, t);
}

// The code (0..7) of the e2m1 magnitude nearest to v (0 <= v), ties to the even code.
std::uint8_t round_e2m1(double v) {
  if (v >= kE2m1[7]) return 7;
  std::uint8_t i = 0;
  while (v > kE2m1[i + 1]) ++i;  // kE2m1[i] <= v <= kE2m1[i + 1]
  const double mid = 0.5 * (kE2m1[i] + kE2m1[i + 1]);
  if (v < mid) return i;
  if (v > mid) return static_cast<std::uint8_t>(i + 1);
  return i % 2 == 0 ? i : static_cast<std::uint8_t>(i + 1);
}

// The shared exponent of a block with max magnitude m (see mxfp4_encode).
int shared_exponent(double m) {
  if (m == 0.0) return 0;
  int e = std::ilogb(m) - 2;  // m / 2^e in [4, 8)
  if (m > std::ldexp(kE2m1[7], e)) ++e;
  return std::clamp(e, -127, 127);
}

}  // namespace

double e2m1_value(std::uint8_t code) {
  MESHTEST_CHECK(code < 16, "e2m1 code {} is outside 0..15", code);
  return code < 8 ? kE2m1[code] : -kE2m1[code - 8];
}

double e8m0_scale(std::uint8_t s) { return std::ldexp(1.0, static_cast<int>(s) - 127); }

void check_mxfp4(const Shape& b, DType b_dtype, const Shape& s, DType s_dtype,
                 std::string_view what) {
  MESHTEST_CHECK(b_dtype == DType::u8 && s_dtype == DType::u8,
                 "{}: blocks {}{} and scales {}{} must both be u8", what, b_dtype, b, s_dtype, s);
  MESHTEST_CHECK(b.rank() >= 2 && b[b.rank() - 1] == kMxfp4BlockBytes,
                 "{}: blocks shape {} must be [..., nblocks, {}]", what, b, kMxfp4BlockBytes);
  const std::vector<std::int64_t> dims = b.vec();
  const Shape want(std::span(dims.data(), dims.size() - 1));
  MESHTEST_CHECK(s == want, "{}: scales shape {} does not match blocks shape {}: expected {}", what,
                 s, b, want);
}

void check_mxfp4(const Tensor& blocks, const Tensor& scales, std::string_view what) {
  check_mxfp4(blocks.shape(), blocks.dtype(), scales.shape(), scales.dtype(), what);
}

Shape mxfp4_decoded_shape(const Shape& blocks) {
  MESHTEST_CHECK(blocks.rank() >= 2, "mxfp4: blocks shape {} must be [..., nblocks, {}]", blocks,
                 kMxfp4BlockBytes);
  std::vector<std::int64_t> dims = blocks.vec();
  dims.pop_back();
  // nblocks * 16 fits in int64, nblocks * 32 need not (a header can claim [0, 2^58, 16]).
  const bool fits = !__builtin_mul_overflow(dims.back(), kMxfp4BlockValues, &dims.back());
  MESHTEST_CHECK(fits, "mxfp4: blocks shape {} decodes to a last dim beyond int64", blocks);
  return Shape(dims);  // throws Error when the decoded element count overflows int64
}

Tensor mxfp4_decode(const Tensor& blocks, const Tensor& scales, DType out) {
  perf::OpScope scope("mxfp4_decode");
  scope.input(blocks).input(scales);
  check_mxfp4(blocks, scales, "mxfp4_decode");
  check_float_out(out, "mxfp4_decode");
  Tensor result(mxfp4_decoded_shape(blocks.shape()), out);
  const std::uint8_t* b = blocks.data<std::uint8_t>();
  const std::uint8_t* s = scales.data<std::uint8_t>();
  visit_dtype(out, [&]<class T>(type_tag<T>) {
    if constexpr (is_floating(dtype_of<T>())) {
      T* o = result.data<T>();
      for (std::int64_t g = 0; g < scales.numel(); ++g) {
        const double scale = e8m0_scale(s[g]);
        for (std::int64_t i = 0; i < kMxfp4BlockBytes; ++i) {
          const std::uint8_t byte = b[g * kMxfp4BlockBytes + i];
          T* dst = o + g * kMxfp4BlockValues + 2 * i;
          dst[0] = static_cast<T>(e2m1_value(byte & 0x0F) * scale);
          dst[1] = static_cast<T>(e2m1_value(byte >> 4) * scale);
        }
      }
    }
  });
  scope.output(result).flops(static_cast<double>(result.numel()));
  return result;
}

Mxfp4 mxfp4_encode(const Tensor& w) {
  MESHTEST_CHECK(is_floating(w.dtype()), "mxfp4_encode: input {} is not bf16, f16, f32 or f64",
                 describe(w));
  MESHTEST_CHECK(w.rank() >= 1 && w.shape()[w.rank() - 1] % kMxfp4BlockValues == 0,
                 "mxfp4_encode: input shape {} must be [..., n] with n a multiple of {}", w.shape(),
                 kMxfp4BlockValues);
  std::vector<std::int64_t> dims = w.shape().vec();
  dims.back() /= kMxfp4BlockValues;
  Tensor scales(Shape(dims), DType::u8);
  dims.push_back(kMxfp4BlockBytes);
  Tensor blocks(Shape(dims), DType::u8);
  const Tensor x = w.astype(DType::f64);
  const double* v = x.data<double>();
  std::uint8_t* b = blocks.data<std::uint8_t>();
  std::uint8_t* s = scales.data<std::uint8_t>();
  for (std::int64_t g = 0; g < scales.numel(); ++g) {
    const double* blk = v + g * kMxfp4BlockValues;
    double m = 0.0;
    for (std::int64_t i = 0; i < kMxfp4BlockValues; ++i) {
      MESHTEST_CHECK(std::isfinite(blk[i]), "mxfp4_encode: element {} is {}, expected finite",
                     g * kMxfp4BlockValues + i, blk[i]);
      m = std::max(m, std::abs(blk[i]));
    }
    const int e = shared_exponent(m);
    s[g] = static_cast<std::uint8_t>(e + 127);
    for (std::int64_t i = 0; i < kMxfp4BlockValues; ++i) {
      const std::uint8_t mag = round_e2m1(std::ldexp(std::abs(blk[i]), -e));
      const std::uint8_t code = std::signbit(blk[i]) ? static_cast<std::uint8_t>(mag | 8) : mag;
      std::uint8_t& byte = b[g * kMxfp4BlockBytes + i / 2];
      byte = static_cast<std::uint8_t>(i % 2 == 0 ? code : byte | (code << 4));
    }
  }
  return {std::move(blocks), std::move(scales)};
}

}  // namespace meshtest
