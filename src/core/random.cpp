// Philox-4x32-10, the per-element draws, and whole or sliced random tensors.
#include "src/core/random.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <utility>

namespace meshtest {
namespace {

__extension__ typedef unsigned __int128 u128;

constexpr std::uint32_t lo32(std::uint64_t x) { return static_cast<std::uint32_t>(x); }
constexpr std::uint32_t hi32(std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); }
constexpr std::uint64_t join64(std::uint32_t hi, std::uint32_t lo) {
  return (std::uint64_t{hi} << 32) | lo;
}

// The integers [min, max] that the dtype holds exactly.
std::pair<std::int64_t, std::int64_t> exact_integer_range(DType t) {
  constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
  switch (t) {
    case DType::f32:
      return {-(std::int64_t{1} << 24), std::int64_t{1} << 24};
    case DType::f64:
      return {-(std::int64_t{1} << 53), std::int64_t{1} << 53};
    case DType::bf16:
      return {-256, 256};
    case DType::f16:
      return {-2048, 2048};
    case DType::i32:
      return {-kI32Max - 1, kI32Max};
    case DType::i64:
      return {-kI64Max - 1, kI64Max};
    case DType::u8:
      return {0, 255};
  }
  return {0, 0};
}

void check_distribution(const Distribution& dist, DType dtype) {
  if (const auto* n = std::get_if<Normal>(&dist)) {
    MESHTEST_CHECK(is_floating(dtype), "random normal: dtype {} is not floating (use Integers)",
                   dtype);
    MESHTEST_CHECK(std::isfinite(n->mean) && std::isfinite(n->std) && n->std >= 0,
                   "random normal: need a finite mean and a finite std >= 0, got mean {} std {}",
                   n->mean, n->std);
  } else if (const auto* u = std::get_if<Uniform>(&dist)) {
    MESHTEST_CHECK(is_floating(dtype), "random uniform: dtype {} is not floating (use Integers)",
                   dtype);
    MESHTEST_CHECK(std::isfinite(u->lo) && std::isfinite(u->hi) && u->lo <= u->hi,
                   "random uniform: need finite lo <= hi, got [{}, {})", u->lo, u->hi);
  } else {
    const auto& r = std::get<Integers>(dist);
    MESHTEST_CHECK(r.lo <= r.hi, "random integers: lo {} > hi {}", r.lo, r.hi);
    const auto [min, max] = exact_integer_range(dtype);
    MESHTEST_CHECK(r.lo >= min && r.hi <= max,
                   "random integers: [{}, {}] is not exactly representable in {} (need [{}, {}])",
                   r.lo, r.hi, dtype, min, max);
  }
}

double sample(const Normal& d, RandomKey key, std::uint64_t i) {
  return d.mean + d.std * normal_at(key, i);
}
double sample(const Uniform& d, RandomKey key, std::uint64_t i) {
  return d.lo + (d.hi - d.lo) * uniform_at(key, i);
}
std::int64_t sample(const Integers& d, RandomKey key, std::uint64_t i) {
  return integer_at(key, i, d.lo, d.hi);
}

// Which global flat indices an output covers: for o < outer, j < size, k < inner the
// output element (o, j, k) is global index (o * n + start + j) * inner + k.
struct SliceLayout {
  std::uint64_t outer = 1, n = 0, start = 0, size = 0, inner = 1;
};

Tensor generate_layout(Shape out_shape, const SliceLayout& l, DType dtype, RandomKey key,
                       const Distribution& dist) {
  check_distribution(dist, dtype);
  Tensor t(out_shape, dtype);
  visit_dtype(dtype, [&]<class T>(type_tag<T>) {
    std::visit(
        [&](const auto& d) {
          T* out = t.data<T>();
          for (std::uint64_t o = 0; o < l.outer; ++o) {
            for (std::uint64_t j = 0; j < l.size; ++j) {
              const std::uint64_t base = (o * l.n + l.start + j) * l.inner;
              for (std::uint64_t k = 0; k < l.inner; ++k) {
                *out++ = static_cast<T>(sample(d, key, base + k));
              }
            }
          }
        },
        dist);
  });
  return t;
}

}  // namespace

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c,
                                           std::array<std::uint32_t, 2> k) {
  constexpr std::uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;  // round multipliers
  constexpr std::uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const std::uint64_t p0 = std::uint64_t{kM0} * c[0];
    const std::uint64_t p1 = std::uint64_t{kM1} * c[2];
    c = {hi32(p1) ^ c[1] ^ k[0], lo32(p1), hi32(p0) ^ c[3] ^ k[1], lo32(p0)};
  }
  return c;
}

std::array<std::uint32_t, 4> random_bits_at(RandomKey key, std::uint64_t i) {
  return philox4x32_10({lo32(i), hi32(i), lo32(key.stream), hi32(key.stream)},
                       {lo32(key.seed), hi32(key.seed)});
}

double uniform_at(RandomKey key, std::uint64_t i) {
  const auto w = random_bits_at(key, i);
  return static_cast<double>(join64(w[1], w[0]) >> 11) * 0x1p-53;
}

double normal_at(RandomKey key, std::uint64_t i) {
  const auto w = random_bits_at(key, i);
  const double u1 = static_cast<double>((join64(w[1], w[0]) >> 11) + 1) * 0x1p-53;  // (0, 1]
  const double u2 = static_cast<double>(join64(w[3], w[2]) >> 11) * 0x1p-53;        // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::int64_t integer_at(RandomKey key, std::uint64_t i, std::int64_t lo, std::int64_t hi) {
  MESHTEST_CHECK(lo <= hi, "integer_at: lo {} > hi {}", lo, hi);
  const auto w = random_bits_at(key, i);
  const std::uint64_t x = join64(w[1], w[0]);
  // n = hi - lo + 1 wraps to 0 for the full int64 range, where x itself is the offset.
  const std::uint64_t n = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
  const std::uint64_t offset = n == 0 ? x : static_cast<std::uint64_t>((u128{x} * n) >> 64);
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(lo) + offset);
}

Tensor generate(Shape shape, DType dtype, RandomKey key, const Distribution& dist) {
  const auto numel = static_cast<std::uint64_t>(shape.numel());
  return generate_layout(shape, {.outer = 1, .n = numel, .start = 0, .size = numel, .inner = 1},
                         dtype, key, dist);
}

Tensor generate_slice(Shape global, int dim, Range r, DType dtype, RandomKey key,
                      const Distribution& dist) {
  const int d = global.normalize_dim(dim);
  MESHTEST_CHECK(r.start >= 0 && r.size >= 0 && r.start + r.size <= global[d],
                 "generate_slice: [{}, {}) out of range along dim {} of global shape {}", r.start,
                 r.start + r.size, d, global);
  const SliceLayout l{.outer = static_cast<std::uint64_t>(global.outer(d)),
                      .n = static_cast<std::uint64_t>(global[d]),
                      .start = static_cast<std::uint64_t>(r.start),
                      .size = static_cast<std::uint64_t>(r.size),
                      .inner = static_cast<std::uint64_t>(global.inner(d))};
  return generate_layout(global.with(d, r.size), l, dtype, key, dist);
}

Tensor random_normal(Shape shape, DType dtype, RandomKey key, double mean, double std) {
  return generate(shape, dtype, key, Normal{mean, std});
}

Tensor random_uniform(Shape shape, DType dtype, RandomKey key, double lo, double hi) {
  return generate(shape, dtype, key, Uniform{lo, hi});
}

Tensor random_integers(Shape shape, DType dtype, RandomKey key, std::int64_t lo, std::int64_t hi) {
  return generate(shape, dtype, key, Integers{lo, hi});
}

}  // namespace meshtest
