// silu, silu_backward and swiglu_backward against loops and central finite differences in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "src/core/random.hpp"
#include "src/ops/activations.hpp"
#include "src/ops/swiglu_grad.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest {
namespace test_ops_swiglu_grad {

using test_support::expect_error;

double silu_ref(double x) { return x / (1 + std::exp(-x)); }

// 8 ulps of `want` in f64 (mantissa 52) or f32 (23): silu is std::exp, a sum, a quotient and a
// product, each within an ulp or two on any processor.
double ulps8(double want, int mantissa = 52) { return 8 * std::ldexp(std::abs(want), -mantissa); }

// Central difference of L(x) = Σ grad_out · f(x) in element i of x (f64), summed as
// Σ grad_out · (f(x + h e_i) - f(x - h e_i)) / 2h: f is elementwise, so the outputs that e_i
// does not reach cancel exactly and only the perturbed one carries rounding error.
double central_difference(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                          const Tensor& grad_out, std::int64_t i, double h = 1e-6) {
  const auto at = [&](double delta) {
    Tensor xs = x;
    xs.span<double>()[i] += delta;
    return f(xs);
  };
  const Tensor up = at(h), down = at(-h);
  double sum = 0;
  for (std::int64_t c = 0; c < up.numel(); ++c) {
    sum += grad_out.item(c) * (up.item(c) - down.item(c));
  }
  return sum / (2 * h);
}

TEST(Silu, MatchesTheLoopInEveryDtypeAndShape) {
  const std::vector<double> v{0, 1, -1, 0.5, -3, 20, -20, 80, -745, 1e-8, 2.5, -0.25};
  const Tensor x = Tensor::from_vector(Shape{2, 3, 2}, v);
  const Tensor y = silu(x);
  ASSERT_EQ(y.shape(), x.shape());
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_NEAR(y.item(i), silu_ref(v[i]), ulps8(silu_ref(v[i]))) << i;
  }
  EXPECT_EQ(y.item(0), 0.0);
  EXPECT_EQ(y.item(7), 80.0);  // σ(80) is 1 in double
  EXPECT_EQ(y.item(8), 0.0);   // σ(-745) underflows to 0: no NaN
  const Tensor y32 = silu(x.astype(DType::f32));
  EXPECT_EQ(y32.dtype(), DType::f32);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto xf = static_cast<float>(v[i]);
    EXPECT_NEAR(y32.item(i), silu_ref(xf), ulps8(silu_ref(xf), 23)) << i;
  }
  // bf16: x · σ(x) of the bf16 input in f32, rounded once to bf16.
  const Tensor xb = x.astype(DType::bf16);
  const Tensor yb = silu(xb);
  EXPECT_EQ(yb.dtype(), DType::bf16);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float xf = static_cast<float>(xb.item(i));
    const float want = static_cast<float>(bf16(xf * (1.0f / (1.0f + std::exp(-xf)))));
    EXPECT_EQ(yb.item(i), want) << i;
  }
  // Rank 0, rank 1 and empty.
  EXPECT_NEAR(silu(Tensor::from_vector(Shape{}, std::vector<double>{2})).item(0), silu_ref(2),
              ulps8(silu_ref(2)));
  EXPECT_EQ(silu(Tensor(Shape{0, 5}, DType::f32)).shape(), (Shape{0, 5}));
  expect_error([] { silu(Tensor(Shape{3}, DType::i32)); }, {"silu", "i32"});
}

TEST(SiluBackward, MatchesCentralDifferences) {
  const Tensor x = random_normal(Shape{3, 7}, DType::f64, {.seed = 31, .stream = 0}, 0, 4);
  const Tensor g = random_normal(Shape{3, 7}, DType::f64, {.seed = 31, .stream = 1});
  const Tensor gx = silu_backward(x, g);
  ASSERT_EQ(gx.shape(), x.shape());
  // Truncation h²/6 |g silu'''| ≲ 1e-12 and the rounding of the perturbed output, ≲ 2 ulps of
  // |g silu(x)| over 2h ≈ 4e-10 |x g|: below 1e-8 (1 + |fd|) with |fd| ≈ |g| for large |x|.
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double fd = central_difference([](const Tensor& t) { return silu(t); }, x, g, i);
    EXPECT_NEAR(gx.item(i), fd, 1e-8 * (1 + std::abs(fd))) << "x " << x.item(i);
  }
  // Closed forms: silu'(0) = 1/2; far out the derivative tends to 1 and 0 (σ(60) rounds to 1,
  // so 1 is exact up to the ulps allowed).
  const Tensor ones = Tensor::from_vector(Shape{3}, std::vector<double>{1, 1, 1});
  const Tensor d =
      silu_backward(Tensor::from_vector(Shape{3}, std::vector<double>{0, 60, -60}), ones);
  EXPECT_EQ(d.item(0), 0.5);
  EXPECT_NEAR(d.item(1), 1.0, ulps8(1.0));
  EXPECT_NEAR(d.item(2), 0.0, 1e-20);  // -60 σ(-60) ≈ -5e-25
  // f32 follows f64: elementwise, the f32-rounded x and g (2^-24 relative, times |silu''| <=
  // 1/2) and a few f32 roundings stay below 1e-6 (1 + |gx|); 1e-5 leaves 10x.
  const Tensor gx32 = silu_backward(x.astype(DType::f32), g.astype(DType::f32));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_NEAR(gx32.item(i), gx.item(i), 1e-5 * (1 + std::abs(gx.item(i)))) << i;
  }
  EXPECT_EQ(silu_backward(Tensor(Shape{0}, DType::f32), Tensor(Shape{0}, DType::f32)).numel(), 0);
  expect_error(
      [&] {
        silu_backward(x, g.reshape(Shape{7, 3}));
      },
      {"silu_backward", "grad_out", "[7, 3]"});
  expect_error([&] { silu_backward(x, g.astype(DType::f32)); }, {"silu_backward", "dtype"});
  expect_error([&] { silu_backward(x.astype(DType::bf16), g.astype(DType::bf16)); },
               {"silu_backward", "bf16"});
}

// Moves every x_glu and |x_lin| at least `gap` away from the clamp `limit` (where the forward
// has a kink), so a central difference of step << gap sees one smooth piece.
Tensor away_from_kinks(Tensor x, double limit, double gap) {
  for (double& v : x.span<double>()) {
    const double m = std::abs(v);
    if (std::abs(m - limit) < gap) v = std::copysign(m < limit ? limit - gap : limit + gap, v);
  }
  return x;
}

TEST(SwigluBackward, MatchesCentralDifferencesInsideAndBeyondTheClamp) {
  struct Case {
    Shape shape;
    double alpha, limit;
  };
  for (const Case& c : {Case{Shape{4, 10}, kSwigluAlpha, kSwigluLimit},
                        Case{Shape{2, 3, 6}, 1.0, 3.0}, Case{Shape{16}, 0.5, 1.5}}) {
    // Spread 1.3 · limit wide so some of each half lies beyond the clamp.
    Tensor x = random_normal(c.shape, DType::f64, {.seed = 32, .stream = 0}, 0, 1.3 * c.limit);
    x = away_from_kinks(x, c.limit, 1e-3);
    const Shape out_shape = c.shape.with(c.shape.rank() - 1, c.shape[c.shape.rank() - 1] / 2);
    const Tensor g = random_normal(out_shape, DType::f64, {.seed = 32, .stream = 1});
    const Tensor gx = swiglu_backward(x, g, c.alpha, c.limit);
    ASSERT_EQ(gx.shape(), x.shape());
    const auto f = [&](const Tensor& t) { return swiglu(t, c.alpha, c.limit); };
    // Truncation h²/6 |f'''| ≲ 1e-11 on a smooth piece (x is 1e-3 from the kinks) and the
    // rounding of the perturbed output, ≲ 2 ulps of |g f| ≲ 56 |g| over 2h ≈ 1.4e-8 |g|: below
    // 1e-8 (1 + |fd|), as fd ≈ g ∂f/∂x is several |g| wherever |f| is large.
    int beyond = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double fd = central_difference(f, x, g, i);
      EXPECT_NEAR(gx.item(i), fd, 1e-8 * (1 + std::abs(fd)))
          << fmt::format("{}", c.shape) << " alpha " << c.alpha << " limit " << c.limit << " x "
          << x.item(i);
      const bool glu = i % 2 == 0;
      if ((glu && x.item(i) > c.limit) || (!glu && std::abs(x.item(i)) > c.limit)) {
        EXPECT_EQ(gx.item(i), 0.0) << i;
        ++beyond;
      }
    }
    EXPECT_GT(beyond, 0) << "no point beyond the clamp in " << fmt::format("{}", c.shape);
  }
}

TEST(SwigluBackward, CraftedPointsAtAndBeyondTheClamp) {
  const double a = kSwigluAlpha, lim = kSwigluLimit;
  const auto sig = [](double z) { return 1 / (1 + std::exp(-z)); };
  // Pairs (x_glu, x_lin), grad_out 1 for each.
  const std::vector<double> pairs{7.5,  0.5,    // glu beyond: d/dglu 0
                                  1e3,  -1e3,   // both far beyond
                                  1.0,  7.001,  // lin just beyond +limit
                                  -2.0, -8.0,   // lin beyond -limit, glu has no lower clamp
                                  -30,  2.0,    // glu far below: still differentiable
                                  7.0,  -7.0};  // both at the boundary: the gradient passes
  const Tensor x = Tensor::from_vector(Shape{6, 2}, pairs);
  const Tensor g = Tensor::from_vector(Shape{6, 1}, std::vector<double>(6, 1.0));
  const Tensor gx = swiglu_backward(x, g);
  const auto d_glu = [&](double glu, double lin) {
    const double l = std::clamp(lin, -lim, lim), s = sig(a * glu);
    return (l + 1) * s * (1 + a * glu * (1 - s));
  };
  const auto d_lin = [&](double glu) { return glu * sig(a * glu); };
  // The op's formula with the same std::exp, at most a rounding or two apart (FMA): the
  // tolerances are 5 ulps of the values or more.
  EXPECT_EQ(gx.item(0), 0.0);
  EXPECT_NEAR(gx.item(1), d_lin(7.0), 1e-14);  // g = min(7.5, 7)
  EXPECT_EQ(gx.item(2), 0.0);
  EXPECT_EQ(gx.item(3), 0.0);
  EXPECT_NEAR(gx.item(4), d_glu(1.0, 7.0), 1e-14);  // l = 7
  EXPECT_EQ(gx.item(5), 0.0);
  EXPECT_NEAR(gx.item(6), d_glu(-2.0, -8.0), 1e-15);  // l + 1 = -6
  EXPECT_EQ(gx.item(7), 0.0);
  EXPECT_NEAR(gx.item(8), d_glu(-30, 2.0), 1e-15);
  EXPECT_NEAR(gx.item(9), d_lin(-30), 1e-15);
  EXPECT_NEAR(gx.item(10), d_glu(7.0, -7.0), 1e-14);
  EXPECT_NEAR(gx.item(11), d_lin(7.0), 1e-14);
  // At the boundary the gradient is the one-sided derivative from inside the clamp. Truncation
  // h²/3 |f'''| ≈ 3e-10 and the rounding of Σ swiglu (partial sums ≲ 50, weights 3, 4, 1) over
  // 2h ≈ 5e-9: 1e-7 is 20x above.
  const auto one_sided = [&](std::int64_t i, double h) {
    Tensor lo = x;
    lo.span<double>()[i] -= h;
    Tensor lo2 = x;
    lo2.span<double>()[i] -= 2 * h;
    // Second-order backward difference of Σ swiglu.
    const auto sum = [](const Tensor& t) { return swiglu(t).vector<double>().sum(); };
    return (3 * sum(x) - 4 * sum(lo) + sum(lo2)) / (2 * h);
  };
  EXPECT_NEAR(gx.item(10), one_sided(10, 1e-5), 1e-7);
  EXPECT_NEAR(gx.item(11), one_sided(11, -1e-5), 1e-7);  // from above -limit
}

TEST(SwigluBackward, F32FollowsF64AndEdgeShapes) {
  Tensor x = random_normal(Shape{5, 12}, DType::f64, {.seed = 33, .stream = 0}, 0, 8);
  const Tensor g = random_normal(Shape{5, 6}, DType::f64, {.seed = 33, .stream = 1});
  x = away_from_kinks(x, kSwigluLimit, 1e-3);
  const Tensor g64 = swiglu_backward(x, g);
  const Tensor g32 = swiglu_backward(x.astype(DType::f32), g.astype(DType::f32));
  EXPECT_EQ(g32.dtype(), DType::f32);
  // Elementwise in f32: the f32-rounded inputs (2^-24 relative, times derivatives ≲ 10) and
  // f32's 1 - σ near the clamp (σ(1.702 · 7) ≈ 1 - 7e-6: ≲ 1e-6 relative) stay below
  // 1e-6 (1 + |g|); 1e-5 leaves 10x.
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_NEAR(g32.item(i), g64.item(i), 1e-5 * (1 + std::abs(g64.item(i)))) << i;
  }
  EXPECT_EQ(
      swiglu_backward(Tensor(Shape{0, 4}, DType::f64), Tensor(Shape{0, 2}, DType::f64)).shape(),
      (Shape{0, 4}));
  EXPECT_EQ(
      swiglu_backward(Tensor(Shape{3, 0}, DType::f32), Tensor(Shape{3, 0}, DType::f32)).shape(),
      (Shape{3, 0}));
}

TEST(SwigluBackward, BadInputThrows) {
  const Tensor x(Shape{2, 4}, DType::f32);
  const Tensor g(Shape{2, 2}, DType::f32);
  expect_error(
      [] {
        swiglu_backward(Tensor(Shape{2, 3}, DType::f32), Tensor(Shape{2, 1}, DType::f32));
      },
      {"swiglu_backward", "[2, 3]", "even"});
  expect_error(
      [&] {
        swiglu_backward(x, Tensor(Shape{2, 4}, DType::f32));
      },
      {"swiglu_backward", "grad_out", "[2, 2]"});
  expect_error(
      [&] {
        swiglu_backward(x, Tensor(Shape{1, 2}, DType::f32));
      },
      {"swiglu_backward", "grad_out"});
  expect_error([&] { swiglu_backward(x, g.astype(DType::f64)); },
               {"swiglu_backward", "grad_out", "dtype"});
  expect_error([&] { swiglu_backward(x.astype(DType::bf16), g.astype(DType::bf16)); },
               {"swiglu_backward", "bf16"});
  expect_error([&] { swiglu_backward(x, g, kSwigluAlpha, 0.0); }, {"swiglu_backward", "limit"});
  expect_error([&] { swiglu_backward(x, g, NAN); }, {"swiglu_backward", "alpha"});
  expect_error([] { swiglu_backward(Tensor(Shape{}, DType::f32), Tensor(Shape{}, DType::f32)); },
               {"swiglu_backward", "[..., 2I]"});
}

}  // namespace test_ops_swiglu_grad
}  // namespace meshtest
