// ULP distance: how many representable values lie between two floats of the same format.
#include "src/check/ulp.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "src/check/metrics.hpp"

namespace meshtest {
namespace {

/// Sign-magnitude bit patterns mapped onto one ordered line: the distance is the difference of
/// magnitudes on the same side of zero and their sum across it (so -0 and +0 coincide).
template <class Bits, class T>
std::uint64_t ordered_distance(T a, T b) {
  if (std::isnan(static_cast<double>(a)) || std::isnan(static_cast<double>(b))) {
    return kUlpNaN;
  }
  constexpr Bits sign = Bits{1} << (8 * sizeof(Bits) - 1);
  const Bits ua = std::bit_cast<Bits>(a), ub = std::bit_cast<Bits>(b);
  const std::uint64_t ma = ua & ~sign, mb = ub & ~sign;
  if ((ua & sign) == (ub & sign)) {
    return ma > mb ? ma - mb : mb - ma;
  }
  return ma + mb;  // at most 2 * (2^63 - 1) for f64: no overflow
}

}  // namespace

std::uint64_t ulp_distance(float a, float b) { return ordered_distance<std::uint32_t>(a, b); }
std::uint64_t ulp_distance(double a, double b) { return ordered_distance<std::uint64_t>(a, b); }
std::uint64_t ulp_distance(bf16 a, bf16 b) { return ordered_distance<std::uint16_t>(a, b); }
std::uint64_t ulp_distance(f16 a, f16 b) { return ordered_distance<std::uint16_t>(a, b); }

std::uint64_t ulp_distance(const Tensor& expected, const Tensor& got) {
  check_same_shape("ulp_distance", expected, got);
  MESHTEST_CHECK(expected.dtype() == got.dtype() && is_floating(expected.dtype()),
                 "ulp_distance: needs one floating dtype (f32, f64, bf16 or f16) for both tensors; "
                 "expected is {}, got is {}",
                 expected.dtype(), got.dtype());
  return visit_dtype(expected.dtype(), [&]<class T>(type_tag<T>) -> std::uint64_t {
    if constexpr (is_floating(dtype_of<T>())) {
      const auto e = expected.span<T>(), g = got.span<T>();
      std::uint64_t worst = 0;
      for (std::size_t i = 0; i < e.size(); ++i) {
        worst = std::max(worst, ulp_distance(e[i], g[i]));
      }
      return worst;
    } else {
      return 0;  // unreachable: the dtype was checked above
    }
  });
}

}  // namespace meshtest
