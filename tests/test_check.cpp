// src/check: pcc, allclose, nmse, max errors, ULP distance, compare() and owner_of.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <sstream>

#include "src/check/compare.hpp"
#include "src/check/metrics.hpp"
#include "src/check/ulp.hpp"

namespace meshtest {
namespace test_check {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Empty inputs skip Tensor::from_vector, whose memcpy from a null data() trips UBSan.
Tensor f64(const std::vector<double>& v) {
  if (v.empty()) return Tensor(Shape{0}, DType::f64);
  return Tensor::from_vector(Shape{static_cast<std::int64_t>(v.size())}, v);
}
Tensor f32(const std::vector<float>& v) {
  if (v.empty()) return Tensor(Shape{0}, DType::f32);
  return Tensor::from_vector(Shape{static_cast<std::int64_t>(v.size())}, v);
}
bf16 bf16_bits(std::uint16_t bits) { return std::bit_cast<bf16>(bits); }

// ---- pcc -----------------------------------------------------------------------------------

TEST(Pcc, HandComputedPearson) {
  // x = 1..5, y = 2,4,5,4,5: sum dx*dy = 6, sum dx^2 = 10, sum dy^2 = 6 -> r = 6 / sqrt(60).
  EXPECT_NEAR(pcc(f64({1, 2, 3, 4, 5}), f64({2, 4, 5, 4, 5})), 0.7745966692414834, 1e-15);
  // x = 1,2,3, y = 1,3,2: sum dx*dy = 1, sums of squares 2 and 2 -> r = 0.5.
  EXPECT_NEAR(pcc(f64({1, 2, 3}), f64({1, 3, 2})), 0.5, 1e-15);
  // y = 3 - 2x is perfectly anti-correlated.
  EXPECT_NEAR(pcc(f64({1, 2, 3, 4}), f64({1, -1, -3, -5})), -1.0, 1e-15);
  // Scale invariance survives values whose squares overflow a double.
  EXPECT_NEAR(
      pcc(f64({1e300, 2e300, 3e300, 4e300, 5e300}), f64({2e300, 4e300, 5e300, 4e300, 5e300})),
      0.7745966692414834, 1e-12);
}

TEST(Pcc, AnyDtypeIsComparedAsDouble) {
  const Tensor x = f32({1, 2, 3, 4, 5});
  const Tensor y = Tensor::from_vector(Shape{5}, std::vector<std::int32_t>{2, 4, 5, 4, 5});
  EXPECT_NEAR(pcc(x, y), 0.7745966692414834, 1e-15);
  EXPECT_NEAR(pcc(x.astype(DType::bf16), y.astype(DType::f64)), 0.7745966692414834, 1e-15);
  EXPECT_EQ(pcc(x, x.astype(DType::i64)), 1.0);
}

TEST(Pcc, CompPccRuleBranches) {
  // Both all-NaN -> 1; exactly one all-NaN -> 0.
  EXPECT_EQ(pcc(f64({kNaN, kNaN}), f64({kNaN, kNaN})), 1.0);
  EXPECT_EQ(pcc(f64({kNaN, kNaN}), f64({1, 2})), 0.0);
  EXPECT_EQ(pcc(f64({1, 2}), f64({kNaN, kNaN})), 0.0);
  // NaN/Inf are zeroed in both, so these become equal -> 1.
  EXPECT_EQ(pcc(f64({1, kNaN, 3}), f64({1, 0, 3})), 1.0);
  EXPECT_EQ(pcc(f64({1, kInf, 3}), f64({1, -kInf, 3})), 1.0);
  // Zeroing happens before the all-zero test: {Inf, 0} is all zero, {1, 0} is not -> 0.
  EXPECT_EQ(pcc(f64({kInf, 0}), f64({1, 0})), 0.0);
  EXPECT_EQ(pcc(f64({kNaN, 0}), f64({0, 0})), 1.0);
  // Exactly one all-zero -> 0.
  EXPECT_EQ(pcc(f64({0, 0, 0}), f64({1, 2, 3})), 0.0);
  EXPECT_EQ(pcc(f64({1, 2, 3}), f64({0, 0, 0})), 0.0);
  // Exactly equal -> 1, even when constant (zero variance), and -0 equals +0.
  EXPECT_EQ(pcc(f64({7, 7, 7}), f64({7, 7, 7})), 1.0);
  EXPECT_EQ(pcc(f64({-0.0, 1}), f64({0.0, 1})), 1.0);
  // Zero variance and not equal -> 0 (our documented choice).
  EXPECT_EQ(pcc(f64({2, 2, 2}), f64({1, 2, 3})), 0.0);
  EXPECT_EQ(pcc(f64({1, 2, 3}), f64({5, 5, 5})), 0.0);
  // Empty tensors -> 1.
  EXPECT_EQ(pcc(Tensor(Shape{0, 3}, DType::f32), Tensor(Shape{0, 3}, DType::bf16)), 1.0);
}

TEST(Pcc, ShapeMismatchThrowsNamingBothShapes) {
  const Tensor a(Shape{2, 3}, DType::f32), b(Shape{3, 2}, DType::f32);
  try {
    pcc(a, b);
    FAIL() << "expected meshtest::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[3, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pcc(f64({1, 2}), f64({1, 2, 3})), Error);
}

// ---- allclose ------------------------------------------------------------------------------

TEST(Allclose, AtolOnly) {
  EXPECT_TRUE(allclose(f64({1, -3}), f64({1.5, -3.5}), 0.0, 0.5));
  EXPECT_FALSE(allclose(f64({1, -3}), f64({1.5000001, -3}), 0.0, 0.5));
  EXPECT_FALSE(allclose(f64({1e9}), f64({1e9 + 1}), 0.0, 0.5));
}

TEST(Allclose, RtolOnlyIsRelativeToExpected) {
  EXPECT_TRUE(allclose(f64({4}), f64({6}), 0.5, 0.0));  // 2 <= 0.5 * 4
  EXPECT_FALSE(allclose(f64({4}), f64({6.25}), 0.5, 0.0));
  EXPECT_TRUE(allclose(f64({6}), f64({4}), 0.5, 0.0));   // 2 <= 0.5 * 6
  EXPECT_FALSE(allclose(f64({2}), f64({4}), 0.5, 0.0));  // 2 >  0.5 * 2
  EXPECT_FALSE(allclose(f64({0}), f64({1e-300}), 0.5, 0.0));
}

TEST(Allclose, NaNAndInf) {
  EXPECT_FALSE(allclose(f64({kNaN}), f64({kNaN}), 1e-5, 1e-8));
  EXPECT_TRUE(allclose(f64({kNaN}), f64({kNaN}), 1e-5, 1e-8, /*equal_nan=*/true));
  EXPECT_FALSE(allclose(f64({1}), f64({kNaN}), 1e-5, 1e-8, true));
  EXPECT_FALSE(allclose(f64({kNaN}), f64({1}), 1e-5, 1e-8, true));
  EXPECT_TRUE(allclose(f64({kInf, -kInf}), f64({kInf, -kInf}), 0, 0));
  EXPECT_FALSE(allclose(f64({kInf}), f64({-kInf}), 1e9, 1e9));
  EXPECT_FALSE(allclose(f64({kInf}), f64({1e308}), 1e9, kInf));
  EXPECT_FALSE(allclose(f64({1}), f64({kInf}), 1e9, 1e9));
}

TEST(Allclose, DefaultToleranceAndEmpty) {
  EXPECT_TRUE(allclose(f64({1}), f64({1 + 1e-6})));  // 1e-6 <= 1e-8 + 1e-5
  EXPECT_FALSE(allclose(f64({1}), f64({1 + 2e-5})));
  EXPECT_TRUE(allclose(f64({}), f64({})));
  EXPECT_THROW(allclose(Tensor(Shape{2, 3}, DType::f32), Tensor(Shape{6}, DType::f32)), Error);
}

// ---- nmse and max errors -------------------------------------------------------------------

TEST(Nmse, ClosedForm) {
  // sum (g-e)^2 = 1, sum e^2 = 1 + 4 + 9 + 16 = 30.
  EXPECT_DOUBLE_EQ(nmse(f64({1, 2, 3, 4}), f64({1, 2, 3, 5})), 1.0 / 30.0);
  EXPECT_DOUBLE_EQ(nmse(f64({3, 4}), f64({0, 0})), 1.0);          // got = 0 gives exactly 1
  EXPECT_DOUBLE_EQ(nmse(f64({3, 4}), f64({6, 8})), 1.0);          // (9 + 16) / 25
  EXPECT_DOUBLE_EQ(nmse(f64({1e200, 0}), f64({2e200, 0})), 1.0);  // no overflow
  EXPECT_EQ(nmse(f64({0, 0}), f64({0, 0})), 0.0);                 // 0/0 = 0
  EXPECT_EQ(nmse(f64({0, 0}), f64({0, 1})), kInf);                // x/0 = +Inf
  EXPECT_EQ(nmse(f64({}), f64({})), 0.0);
  EXPECT_TRUE(std::isnan(nmse(f64({1, 2}), f64({1, kNaN}))));
}

TEST(MaxErrors, AbsAndRel) {
  const Tensor e = f64({1, -2, 4, 0}), g = f64({1.5, -2, 3, 0});
  EXPECT_EQ(max_abs_error(e, g), 1.0);
  EXPECT_EQ(max_rel_error(e, g), 0.5);  // 0.5/1, 0, 1/4, 0/floor = 0
  // Relative to an exact 0: divided by the floor, huge but finite.
  const double rel0 = max_rel_error(f64({0}), f64({1e-3}));
  EXPECT_TRUE(std::isfinite(rel0));
  EXPECT_DOUBLE_EQ(rel0, 1e-3 / kRelErrorFloor);
  // Same Inf and NaN in both count as equal; anything else with NaN/Inf is infinitely wrong.
  EXPECT_EQ(max_abs_error(f64({kInf, kNaN, -0.0}), f64({kInf, kNaN, 0.0})), 0.0);
  EXPECT_EQ(max_rel_error(f64({kInf, kNaN}), f64({kInf, kNaN})), 0.0);
  EXPECT_EQ(max_abs_error(f64({kInf}), f64({1})), kInf);
  EXPECT_EQ(max_rel_error(f64({kInf}), f64({1})), kInf);
  EXPECT_EQ(max_abs_error(f64({1}), f64({kNaN})), kInf);
  EXPECT_EQ(max_abs_error(f64({}), f64({})), 0.0);
  EXPECT_THROW(max_abs_error(f64({1}), f64({1, 2})), Error);
  EXPECT_THROW(max_rel_error(f64({1}), f64({1, 2})), Error);
  EXPECT_THROW(nmse(f64({1}), f64({1, 2})), Error);
}

// ---- ULP -----------------------------------------------------------------------------------

TEST(Ulp, Scalars) {
  EXPECT_EQ(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)), 1u);
  EXPECT_EQ(ulp_distance(std::nextafter(1.0f, 2.0f), 1.0f), 1u);
  EXPECT_EQ(ulp_distance(-0.0f, 0.0f), 0u);
  EXPECT_EQ(ulp_distance(1.0f, 2.0f), 1u << 23);
  EXPECT_EQ(ulp_distance(1.0, 2.0), std::uint64_t{1} << 52);
  EXPECT_EQ(ulp_distance(-1.0f, -2.0f), 1u << 23);
  const float denorm = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(ulp_distance(-denorm, denorm), 2u);  // across zero
  EXPECT_EQ(ulp_distance(-denorm, 0.0f), 1u);
  EXPECT_EQ(ulp_distance(std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()),
            1u);
  EXPECT_EQ(ulp_distance(1.0f, std::numeric_limits<float>::quiet_NaN()), kUlpNaN);
  EXPECT_EQ(ulp_distance(kNaN, kNaN), kUlpNaN);
  // Largest finite f64 of each sign: the sum of magnitudes still fits in 64 bits.
  EXPECT_EQ(ulp_distance(-std::numeric_limits<double>::max(), std::numeric_limits<double>::max()),
            2 * (std::uint64_t{0x7FEFFFFFFFFFFFFF}));
}

TEST(Ulp, Bf16) {
  EXPECT_EQ(ulp_distance(bf16(1.0f), bf16(2.0f)), 128u);  // 7 mantissa bits
  EXPECT_EQ(bf16_bits(0x3F80), bf16(1.0f));
  EXPECT_EQ(ulp_distance(bf16_bits(0x3F80), bf16_bits(0x3F81)), 1u);
  EXPECT_EQ(ulp_distance(bf16(-0.0f), bf16(0.0f)), 0u);
  EXPECT_EQ(ulp_distance(bf16_bits(0x8001), bf16_bits(0x0001)), 2u);
  EXPECT_EQ(ulp_distance(bf16(1.0f), bf16_bits(0x7FC0)), kUlpNaN);
}

TEST(Ulp, F16) {
  EXPECT_EQ(ulp_distance(f16(1.0f), f16(2.0f)), 1024u);  // 10 fraction bits
  EXPECT_EQ(ulp_distance(f16::from_bits(0x3c00), f16::from_bits(0x3c01)), 1u);
  EXPECT_EQ(ulp_distance(f16(-0.0f), f16(0.0f)), 0u);
  EXPECT_EQ(ulp_distance(f16::from_bits(0x8001), f16::from_bits(0x0001)), 2u);
  EXPECT_EQ(ulp_distance(f16::from_bits(0x7bff), f16::from_bits(0x7c00)), 1u);  // 65504 to Inf
  EXPECT_EQ(ulp_distance(f16(1.0f), f16::from_bits(0x7e00)), kUlpNaN);
  EXPECT_EQ(ulp_distance(f16::from_bits(0xfc01), f16(1.0f)), kUlpNaN);
}

TEST(Ulp, TensorsInTheirOwnDtype) {
  const float next = std::nextafter(1.0f, 2.0f);
  EXPECT_EQ(ulp_distance(f32({1, 1, 4}), f32({next, 1, 4})), 1u);
  EXPECT_EQ(ulp_distance(f32({1, 2}), f32({2, 2})), 1u << 23);
  EXPECT_EQ(ulp_distance(f64({1, 2}), f64({2, 2})), std::uint64_t{1} << 52);
  EXPECT_EQ(ulp_distance(f32({1, 2}).astype(DType::bf16), f32({2, 2}).astype(DType::bf16)), 128u);
  EXPECT_EQ(ulp_distance(f32({1, 2}).astype(DType::f16), f32({2, 2}).astype(DType::f16)), 1024u);
  EXPECT_EQ(ulp_distance(f32({1, 2}), f32({1, std::nanf("")})), kUlpNaN);
  EXPECT_EQ(ulp_distance(f32({}), f32({})), 0u);
  EXPECT_THROW(ulp_distance(f32({1}), f64({1})), Error);
  EXPECT_THROW(ulp_distance(f32({1}).astype(DType::i32), f32({1}).astype(DType::i32)), Error);
  EXPECT_THROW(ulp_distance(f32({1}), f32({1, 2})), Error);
}

// ---- compare -------------------------------------------------------------------------------

/// expected = 0..5 as [2, 3]; got differs by +3 at [1, 1] (flat 4) and by -1 at [0, 2].
std::pair<Tensor, Tensor> crafted() {
  const std::vector<float> e = {0, 1, 2, 3, 4, 5};
  std::vector<float> g = e;
  g[4] = 7;
  g[2] = 1;
  return {Tensor::from_vector(Shape{2, 3}, e), Tensor::from_vector(Shape{2, 3}, g)};
}

TEST(Compare, WorstElementIsArgmaxAbsError) {
  const auto [e, g] = crafted();
  for (Metric m : {Metric::pcc, Metric::nmse, Metric::max_abs, Metric::max_rel, Metric::ulp}) {
    const Comparison c = compare(e, g, m, m == Metric::pcc ? 0.99 : 0.01);
    SCOPED_TRACE(c.str());
    EXPECT_EQ(c.metric, metric_name(m));
    EXPECT_FALSE(c.passed);
    EXPECT_EQ(c.worst_index, 4);
    EXPECT_EQ(c.worst_coord, (std::vector<std::int64_t>{1, 1}));
    EXPECT_EQ(c.expected_at_worst, 4.0);
    EXPECT_EQ(c.got_at_worst, 7.0);
    EXPECT_EQ(c.nan_or_inf_count, 0);
    EXPECT_EQ(c.shape, (Shape{2, 3}));
  }
  EXPECT_EQ(compare(e, g, Metric::max_abs, 3.0).value, 3.0);
  EXPECT_TRUE(compare(e, g, Metric::max_abs, 3.0).passed);
  // Ties go to the first element.
  const Comparison tie = compare(f64({1, 2, 3}), f64({2, 2, 4}), Metric::max_abs, 0);
  EXPECT_EQ(tie.worst_index, 0);
}

TEST(Compare, PassRules) {
  const Tensor x = f64({1, 2, 3, 4, 5}), y = f64({2, 4, 5, 4, 5});
  EXPECT_TRUE(compare(x, y, Metric::pcc, 0.77).passed);
  EXPECT_FALSE(compare(x, y, Metric::pcc, 0.78).passed);
  EXPECT_NEAR(compare(x, y, Metric::pcc, 0.77).value, 0.7745966692414834, 1e-15);
  EXPECT_TRUE(compare(x, x, Metric::nmse, 0).passed);
  const float next = std::nextafter(1.0f, 2.0f);
  EXPECT_TRUE(compare(f32({1}), f32({next}), Metric::ulp, 1).passed);
  EXPECT_FALSE(compare(f32({1}), f32({next}), Metric::ulp, 0).passed);
  // Mixed dtypes are compared as doubles.
  EXPECT_TRUE(compare(x, x.astype(DType::bf16), Metric::max_abs, 0).passed);
}

TEST(Compare, NaNInfInGotFailsFirst) {
  const Tensor e = f64({0, 1, 2, 3, 4, 5});
  const Tensor g = f64({0, 1, 2, kNaN, 100, kInf});
  for (Metric m : {Metric::pcc, Metric::max_abs, Metric::nmse, Metric::exact}) {
    const Comparison c = compare(e, g, m, m == Metric::pcc ? -1.0 : 1e300);
    SCOPED_TRACE(c.str());
    EXPECT_FALSE(c.passed);
    EXPECT_EQ(c.nan_or_inf_count, 2);
    EXPECT_EQ(c.worst_index, 3);
    EXPECT_TRUE(std::isnan(c.got_at_worst));
    EXPECT_NE(c.str().find("2 NaN/Inf where expected is finite (first at index 3)"),
              std::string::npos);
  }
  // NaN/Inf that the reference has too are not counted.
  const Comparison same = compare(f64({1, kNaN, kInf}), f64({1, kNaN, kInf}), Metric::max_abs, 0);
  EXPECT_TRUE(same.passed) << same;
  EXPECT_EQ(same.nan_or_inf_count, 0);
  EXPECT_EQ(same.worst_index, -1);
}

TEST(Compare, Allclose) {
  const auto [e, g] = crafted();
  const Comparison c = compare(e, g, Tolerance{.rtol = 0, .atol = 1});
  EXPECT_FALSE(c.passed) << c;
  EXPECT_EQ(c.value, 1.0);  // only flat 4 (error 3) is not close
  EXPECT_EQ(c.worst_index, 4);
  EXPECT_NE(c.str().find("allclose(rtol=0, atol=1)"), std::string::npos) << c;
  EXPECT_TRUE(compare(e, g, Tolerance{.rtol = 0, .atol = 3}).passed);
  EXPECT_THROW(compare(e, g, Metric::allclose, 0.1), Error);
}

TEST(Compare, Exact) {
  const Tensor e = f32({1, 2, 3, 4, 5});
  EXPECT_TRUE(compare(e, e, Metric::exact, 0).passed);
  // First differing element, not the largest error.
  const Comparison c = compare(e, f32({1, 2, 3.5f, 4, 9}), Metric::exact, 0);
  EXPECT_FALSE(c.passed) << c;
  EXPECT_EQ(c.value, 2.0);
  EXPECT_EQ(c.worst_index, 2);
  EXPECT_EQ(c.got_at_worst, 3.5);
  // -0 and +0 are equal values but differing bytes.
  EXPECT_FALSE(compare(f32({0.0f}), f32({-0.0f}), Metric::exact, 0).passed);
  EXPECT_TRUE(compare(f32({0.0f}), f32({-0.0f}), Metric::max_abs, 0).passed);
  // Same values in another dtype are not exact.
  const Comparison d = compare(e, e.astype(DType::f64), Metric::exact, 0);
  EXPECT_FALSE(d.passed);
  EXPECT_NE(d.str().find("dtypes differ: expected f32, got f64"), std::string::npos) << d;
}

TEST(Compare, EmptyTensorsPass) {
  const Tensor a(Shape{0, 3}, DType::f32), b(Shape{0, 3}, DType::f32);
  for (Metric m :
       {Metric::pcc, Metric::nmse, Metric::max_abs, Metric::max_rel, Metric::ulp, Metric::exact}) {
    const Comparison c = compare(a, b, m, m == Metric::pcc ? 0.99 : 0.0);
    EXPECT_TRUE(c.passed) << c;
    EXPECT_EQ(c.worst_index, -1);
  }
  EXPECT_TRUE(compare(a, b, Tolerance{}).passed);
}

TEST(Compare, ShapeMismatchThrows) {
  const Tensor a(Shape{2, 3}, DType::f32), b(Shape{3, 2}, DType::f32);
  for (Metric m : {Metric::pcc, Metric::nmse, Metric::max_abs, Metric::max_rel, Metric::ulp,
                   Metric::exact, Metric::allclose})
    EXPECT_THROW(compare(a, b, m, 0), Error) << metric_name(m);
  EXPECT_THROW(compare(a, b, Tolerance{}), Error);
}

TEST(Compare, StrAndFormatting) {
  const auto [e, g] = crafted();
  Comparison c = compare(e, g, Metric::pcc, 0.99);
  attach_owner(c, 1, 2);  // columns split 2 | 1: column 1 is on device 0
  EXPECT_EQ(c.owner_device, 0);
  attach_owner(c, 0, 2);  // row 1 is on device 1
  EXPECT_EQ(c.owner_device, 1);
  const std::string s = c.str();
  for (const char* part :
       {"FAIL", "pcc", "threshold >= 0.99", "index 4", "[1, 1]", "device 1", "expected 4", "got 7"})
    EXPECT_NE(s.find(part), std::string::npos) << part << " not in: " << s;
  EXPECT_EQ(fmt::format("{}", c), s);
  std::ostringstream os;
  os << c;
  EXPECT_EQ(os.str(), s);

  const Comparison ok = compare(e, e, Metric::max_abs, 1e-3);
  EXPECT_NE(ok.str().find("pass max_abs = 0 (threshold <= 0.001)"), std::string::npos) << ok;
  EXPECT_EQ(ok.str().find("device"), std::string::npos) << ok;
}

// ---- owner_of ------------------------------------------------------------------------------

TEST(OwnerOf, UnevenSplits) {
  // 10 rows over 4 devices: 3, 3, 2, 2 rows.
  const Shape s{10, 3};
  const int want[10] = {0, 0, 0, 1, 1, 1, 2, 2, 3, 3};
  for (int row = 0; row < 10; ++row)
    for (int col = 0; col < 3; ++col)
      EXPECT_EQ(owner_of(s, row * 3 + col, 0, 4), want[row]) << "row " << row << " col " << col;
  // 5 columns over 3 devices: 2, 2, 1.
  EXPECT_EQ(owner_of(Shape{2, 5}, 4, 1, 3), 2);
  EXPECT_EQ(owner_of(Shape{2, 5}, 5 + 3, -1, 3), 1);
  EXPECT_EQ(owner_of(Shape{2, 5}, 5 + 1, 1, 3), 0);
  // More devices than rows: 1, 1, 0, 0.
  EXPECT_EQ(owner_of(Shape{2}, 1, 0, 4), 1);
  EXPECT_EQ(owner_of(Shape{7}, 6, 0, 1), 0);
  EXPECT_THROW(owner_of(Shape{2, 5}, 10, 0, 2), Error);
  EXPECT_THROW(owner_of(Shape{2, 5}, -1, 0, 2), Error);
  EXPECT_THROW(owner_of(Shape{2, 5}, 0, 2, 2), Error);
  EXPECT_THROW(owner_of(Shape{2, 5}, 0, 0, 0), Error);
}

}  // namespace test_check
}  // namespace meshtest
