// src/check/tolerance: the error model's bound, its compare(), and that real sums in other
// orders (and Eigen's products under other cache sizes) stay within it while defects do not.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/eigen_cache.hpp"
#include "src/core/random.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_tolerance {

using test_support::expect_error;

Tensor f64(const std::vector<double>& v) {
  return Tensor::from_vector(Shape{static_cast<std::int64_t>(v.size())}, v);
}

// ---- the bound -----------------------------------------------------------------------------

TEST(ErrorModel, UnitRoundoffs) {
  EXPECT_EQ(unit_roundoff(DType::f64), std::ldexp(1.0, -53));
  EXPECT_EQ(unit_roundoff(DType::f32), std::ldexp(1.0, -24));
  EXPECT_EQ(unit_roundoff(DType::bf16), std::ldexp(1.0, -8));
  EXPECT_EQ(unit_roundoff(DType::f16), std::ldexp(1.0, -11));
  EXPECT_EQ(accumulation_roundoff(DType::bf16), std::ldexp(1.0, -24));  // bf16 adds in f32
  EXPECT_EQ(accumulation_roundoff(DType::f16), std::ldexp(1.0, -24));   // so does f16
  EXPECT_EQ(accumulation_roundoff(DType::f64), std::ldexp(1.0, -53));
  expect_error([] { unit_roundoff(DType::i32); }, {"unit_roundoff", "i32"});
}

TEST(ErrorModel, BoundOnHandComputedCases) {
  const double u32 = std::ldexp(1.0, -24), u16 = std::ldexp(1.0, -8);
  // lambda sqrt(n) u S + u |expected|, exact reference: 1 * 2 * u * 3 + u * 5.
  const ErrorModel four{.terms = 4, .reference = Reference::exact, .lambda = 1};
  EXPECT_DOUBLE_EQ(error_bound(four, 3.0, -5.0), 6 * u32 + 5 * u32);
  // Another order of the same dtype: twice the variance, both sides' final rounding.
  const ErrorModel both{.terms = 8, .reference = Reference::other_order, .lambda = 1};
  EXPECT_DOUBLE_EQ(error_bound(both, 1.0, 2.0), 4 * u32 + 4 * u32);
  // bf16: f32 sums, bf16 roundings of intermediates and of the result.
  const ErrorModel b{
      .dtype = DType::bf16, .terms = 1, .roundings = 3, .reference = Reference::exact, .lambda = 2};
  EXPECT_DOUBLE_EQ(error_bound(b, 1.0, 0.5), 2 * std::sqrt(u32 * u32 + 3 * u16 * u16) + 0.5 * u16);
  // The default lambda.
  EXPECT_DOUBLE_EQ(error_bound({.terms = 1, .reference = Reference::exact}, 1.0, 0.0), 7 * u32);
  EXPECT_EQ(ErrorModel{.terms = 8}.str(), "f32 n=8 r=0 other_order lambda=7");
}

TEST(ErrorModel, BadModelsAreErrorsNamingTheField) {
  expect_error([] { error_bound({.dtype = DType::i64}, 1, 0); }, {"dtype is i64"});
  expect_error([] { error_bound({.terms = -1}, 1, 0); }, {"terms is -1"});
  expect_error([] { error_bound({.roundings = -1}, 1, 0); }, {"roundings is -1"});
  expect_error([] { error_bound({.lambda = 0}, 1, 0); }, {"lambda is 0"});
  expect_error([] { error_bound({.lambda = NAN}, 1, 0); }, {"lambda is nan"});
  expect_error([] { check_model({.terms = -2}, "my case"); }, {"my case.terms is -2"});
  EXPECT_EQ(error_bound({.terms = 0, .reference = Reference::exact}, 5.0, 0.0), 0.0);
  expect_error([] { error_bound({}, -1, 0); }, {"scale -1"});
  expect_error([] { error_bound({}, INFINITY, 0); }, {"scale inf"});
  const Tensor a = f64({1, 2}), s = f64({1, 2, 3});
  expect_error([&] { compare(a, a, ErrorModel{}, s); }, {"scale", "shapes differ"});
  expect_error([&] { compare(a, f64({1}), ErrorModel{}); }, {"shapes differ"});
  expect_error([&] { compare(a, a, ErrorModel{}, f64({1, NAN})); }, {"scale nan at element 1"});
  expect_error([&] { compare(a, a, Metric::model, 1.0); }, {"ErrorModel"});
}

// ---- compare -------------------------------------------------------------------------------

TEST(ErrorModel, CompareReportsTheWorstRatio) {
  const ErrorModel m{.dtype = DType::f64, .terms = 1, .reference = Reference::exact, .lambda = 1};
  const double u = std::ldexp(1.0, -53);
  // Scale 1 everywhere: the bound is u (1 + |expected|).
  const Tensor want = f64({0, 1, 3});
  const Tensor got = f64({0.5 * u, 1 + 2 * u, 3});  // ratios 0.5, 1, 0
  const Comparison ok = compare(want, got, m, 1.0);
  EXPECT_TRUE(ok.passed) << ok;
  EXPECT_EQ(ok.kind, Metric::model);
  EXPECT_DOUBLE_EQ(ok.value, 1.0);
  EXPECT_EQ(ok.worst_index, 1);
  const Comparison bad = compare(want, f64({2 * u, 1, 3}), m, 1.0);  // 2 u over a bound of u
  EXPECT_FALSE(bad.passed);
  EXPECT_DOUBLE_EQ(bad.value, 2.0);
  EXPECT_EQ(bad.worst_index, 0);
  for (const char* part : {"FAIL model(f64 n=1 r=0 exact lambda=1) = 2 (threshold <= 1)", "index 0",
                           "bound", "scale 1"})
    EXPECT_NE(bad.str().find(part), std::string::npos) << part << " not in: " << bad;
  // A per-element scale: element 0 may differ by 10 u, element 1 by 0 + u.
  const Comparison per = compare(f64({0, 0}), f64({9 * u, 0}), m, f64({10, 0}));
  EXPECT_TRUE(per.passed) << per;
  EXPECT_FALSE(compare(f64({0, 0}), f64({0, u}), m, f64({10, 0})).passed);
}

TEST(ErrorModel, ZerosNaNAndTheTensorScale) {
  const ErrorModel m{.terms = 16};
  EXPECT_TRUE(compare(f64({0, 0}), f64({0, 0}), m).passed);  // 0 / 0 is no error
  EXPECT_FALSE(compare(f64({0, 0}), f64({0, 1e-30}), m).passed);
  const Comparison nan = compare(f64({1, 2}), f64({1, NAN}), m);
  EXPECT_FALSE(nan.passed);
  EXPECT_EQ(nan.worst_index, 1);
  EXPECT_NE(nan.note.find("NaN/Inf"), std::string::npos) << nan;
  // The tensor scale is max |expected|: an error fine beside 1000 fails beside 1.
  const double e = 1000 * error_bound(m, 1.0, 0.0);
  EXPECT_TRUE(compare(f64({1, -1000}), f64({1 + e, -1000}), m).passed);
  EXPECT_FALSE(compare(f64({1, -1}), f64({1 + e, -1}), m).passed);
  EXPECT_TRUE(compare(Tensor(Shape{0}, DType::f32), Tensor(Shape{0}, DType::f32), m).passed);
}

// ---- the model against real roundings ------------------------------------------------------

/// f32 sums of `terms` (one row each) in several orders: sequential, reversed, pairwise, and in
/// blocks of 7 added together.
struct Orders {
  static float sequential(const std::vector<float>& t) {
    float s = 0;
    for (float x : t) s += x;
    return s;
  }
  static float reversed(const std::vector<float>& t) {
    float s = 0;
    for (auto it = t.rbegin(); it != t.rend(); ++it) s += *it;
    return s;
  }
  static float pairwise(const float* t, std::size_t n) {
    if (n <= 2) return n == 0 ? 0.0f : n == 1 ? t[0] : t[0] + t[1];
    return pairwise(t, n / 2) + pairwise(t + n / 2, n - n / 2);
  }
  static float blocks(const std::vector<float>& t) {
    float total = 0;
    for (std::size_t b = 0; b < t.size(); b += 7) {
      float s = 0;
      for (std::size_t i = b; i < std::min(t.size(), b + 7); ++i) s += t[i];
      total += s;
    }
    return total;
  }
};

TEST(ErrorModel, SumsInAnyOrderStayWithinTheBoundAndDefectsDoNot) {
  // 64 dot products of 4096 random products, each summed in four f32 orders, against the f64
  // sum; per-element scale sum |terms|.
  constexpr std::int64_t rows = 64, n = 4096;
  const Tensor a = random_normal({rows, n}, DType::f32, {.seed = 11});
  const Tensor b = random_normal({rows, n}, DType::f32, {.seed = 12});
  Tensor exact(Shape{rows}, DType::f64), scale(Shape{rows}, DType::f64);
  std::vector<Tensor> orders(4, Tensor(Shape{rows}, DType::f32));
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<float> t(n);
    double s = 0, mag = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      t[i] = a.span<float>()[r * n + i] * b.span<float>()[r * n + i];  // the f32 products
      s += t[i];
      mag += std::abs(t[i]);
    }
    exact.span<double>()[r] = s;
    scale.span<double>()[r] = mag;
    orders[0].span<float>()[r] = Orders::sequential(t);
    orders[1].span<float>()[r] = Orders::reversed(t);
    orders[2].span<float>()[r] = Orders::pairwise(t.data(), t.size());
    orders[3].span<float>()[r] = Orders::blocks(t);
  }
  const ErrorModel vs_exact{.terms = n, .reference = Reference::exact};
  const ErrorModel vs_other{.terms = n};
  for (std::size_t o = 0; o < orders.size(); ++o) {
    const Comparison c = compare(exact, orders[o], vs_exact, scale);
    EXPECT_TRUE(c.passed) << "order " << o << ": " << c;
    EXPECT_GT(c.value, 0) << "order " << o << " is exact: the check saw no rounding";
    for (std::size_t p = 0; p < orders.size(); ++p) {
      EXPECT_TRUE(compare(orders[p], orders[o], vs_other, scale).passed) << o << " vs " << p;
    }
  }
  // The defects a sharded sum can have: one shard's terms dropped, a scale off by 1e-3, one
  // rounding to bf16 where the path is f32.
  Tensor dropped = orders[0], scaled = orders[0];
  for (std::int64_t r = 0; r < rows; ++r) {
    float shard = 0;
    for (std::int64_t i = 0; i < n / 8; ++i) {
      shard += a.span<float>()[r * n + i] * b.span<float>()[r * n + i];
    }
    dropped.span<float>()[r] -= shard;
    scaled.span<float>()[r] *= 1.001f;
  }
  const Tensor rounded = orders[0].astype(DType::bf16).astype(DType::f32);
  EXPECT_FALSE(compare(exact, dropped, vs_exact, scale).passed);
  EXPECT_FALSE(compare(exact, scaled, vs_exact, scale).passed);
  EXPECT_FALSE(compare(exact, rounded, vs_exact, scale).passed);
}

TEST(ErrorModel, TheTensorScaleHoldsForSameSignedSequentialSums) {
  // The worst order for terms of one sign: 16 sequential f32 sums of 100000 positive terms,
  // whose partial sums grow to the result; the tensor scale max |expected| bounds them.
  constexpr std::int64_t rows = 16, n = 100000;
  const Tensor t = random_uniform({rows, n}, DType::f32, {.seed = 5}, 0.0, 1.0);
  Tensor exact(Shape{rows}, DType::f64), got(Shape{rows}, DType::f32);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = t.span<float>().subspan(r * n, n);
    got.span<float>()[r] = Orders::sequential({row.begin(), row.end()});
    exact.span<double>()[r] = std::accumulate(row.begin(), row.end(), 0.0);
  }
  const Comparison c = compare(exact, got, {.terms = n, .reference = Reference::exact});
  EXPECT_TRUE(c.passed) << c;
  EXPECT_GT(c.value, 0);
}

/// An f32 matrix product by Eigen under the given cache sizes (restored after).
Eigen::MatrixXf product_with_caches(const Eigen::MatrixXf& a, const Eigen::MatrixXf& b,
                                    CacheSizes c) {
  const CacheSizes before = eigen_cache_sizes();
  Eigen::setCpuCacheSizes(c.l1, c.l2, c.l3);
  Eigen::MatrixXf p = a * b;
  Eigen::setCpuCacheSizes(before.l1, before.l2, before.l3);
  return p;
}

TEST(ErrorModel, EigenProductsUnderOtherCacheSizesDifferAndStayWithinTheBound) {
  // [32 x 8192] * [8192 x 24]: the cache sizes change Eigen's depth blocking, hence the order
  // of each dot product's additions; every order stays within the model against f64.
  constexpr Eigen::Index m = 32, k = 8192, n = 24;
  const Tensor ta = random_normal({m, k}, DType::f32, {.seed = 1});
  const Tensor tb = random_normal({k, n}, DType::f32, {.seed = 2});
  const Eigen::MatrixXf a = Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(
      ta.span<float>().data(), m, k);
  const Eigen::MatrixXf b = Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(
      tb.span<float>().data(), k, n);
  const Eigen::MatrixXd exact = a.cast<double>() * b.cast<double>();
  const Eigen::MatrixXd scale = a.cast<double>().cwiseAbs() * b.cast<double>().cwiseAbs();
  const auto as_tensor = [](const auto& mat, DType dt) {
    Tensor t(Shape{mat.rows(), mat.cols()}, DType::f64);
    for (Eigen::Index i = 0; i < mat.rows(); ++i)
      for (Eigen::Index j = 0; j < mat.cols(); ++j)
        t.span<double>()[i * mat.cols() + j] = static_cast<double>(mat(i, j));
    return t.astype(dt);
  };
  const Eigen::MatrixXf tiny = product_with_caches(a, b, parse_cache_sizes("4K,16K,64K"));
  const Eigen::MatrixXf huge = product_with_caches(a, b, parse_cache_sizes("4M,256M,4G"));
  EXPECT_NE((tiny - huge).cwiseAbs().maxCoeff(), 0.0f)
      << "the cache sizes did not change the order of the additions";
  const ErrorModel model{.terms = k, .reference = Reference::exact};
  for (const auto* p : {&tiny, &huge}) {
    const Comparison c = compare(as_tensor(exact, DType::f64), as_tensor(*p, DType::f32), model,
                                 as_tensor(scale, DType::f64));
    EXPECT_TRUE(c.passed) << c;
  }
  const Comparison across = compare(as_tensor(tiny, DType::f32), as_tensor(huge, DType::f32),
                                    ErrorModel{.terms = k}, as_tensor(scale, DType::f64));
  EXPECT_TRUE(across.passed) << across;
}

// ---- MESHTEST_EIGEN_CACHE ------------------------------------------------------------------

TEST(EigenCache, ParsesSizesWithSuffixes) {
  const CacheSizes c = parse_cache_sizes("32K,512k,16M");
  EXPECT_EQ(c.l1, 32 * 1024);
  EXPECT_EQ(c.l2, 512 * 1024);
  EXPECT_EQ(c.l3, 16 * 1024 * 1024);
  EXPECT_EQ(parse_cache_sizes("1024,2G,3g").l3, 3LL << 30);
  EXPECT_EQ(c.str(), "l1 32K, l2 512K, l3 16M");
  EXPECT_EQ(parse_cache_sizes("1536,2M,3M").str(), "l1 1536, l2 2M, l3 3M");
}

TEST(EigenCache, BadValuesAreErrorsNamingTheText) {
  for (const char* bad : {"32K,512K", "32K,512K,16M,1G", "", "a,b,c", "32K,,16M", "-32K,1M,2M",
                          "32KB,1M,2M", "1.5K,1M,2M"}) {
    expect_error([&] { parse_cache_sizes(bad, "MESHTEST_EIGEN_CACHE"); },
                 {"MESHTEST_EIGEN_CACHE", fmt::format("'{}'", bad)});
  }
  expect_error([] { parse_cache_sizes("512,1M,2M"); }, {"512 bytes is out of range [1K, 64G]"});
  expect_error([] { parse_cache_sizes("1K,1M,65G"); }, {"out of range"});
  expect_error([] { parse_cache_sizes("1K,1M,99999999999999G"); }, {"is not a size"});
}

TEST(EigenCache, TheEnvironmentSetsEigensSizes) {
  const char* old = std::getenv("MESHTEST_EIGEN_CACHE");
  const std::string saved = old == nullptr ? "" : old;
  const CacheSizes before = eigen_cache_sizes();
  ::setenv("MESHTEST_EIGEN_CACHE", "8K,64K,1M", 1);
  const auto applied = apply_eigen_cache_env();
  ASSERT_TRUE(applied.has_value());
  EXPECT_EQ(eigen_cache_sizes().l1, 8 * 1024);
  EXPECT_EQ(eigen_cache_sizes().l2, 64 * 1024);
  EXPECT_EQ(eigen_cache_sizes().l3, 1024 * 1024);
  ::setenv("MESHTEST_EIGEN_CACHE", "8K", 1);
  expect_error([] { apply_eigen_cache_env(); }, {"MESHTEST_EIGEN_CACHE '8K'"});
  ::unsetenv("MESHTEST_EIGEN_CACHE");
  EXPECT_FALSE(apply_eigen_cache_env().has_value());
  Eigen::setCpuCacheSizes(before.l1, before.l2, before.l3);
  if (!saved.empty()) ::setenv("MESHTEST_EIGEN_CACHE", saved.c_str(), 1);
}

}  // namespace test_tolerance
}  // namespace meshtest
