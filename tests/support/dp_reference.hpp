// Test helper: DP-SGD references built from per-sample gradients instantiated one sample at a
// time (the model on that sample alone), and naive loops for one Linear layer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/check/tolerance.hpp"
#include "src/core/random.hpp"
#include "src/core/tensor.hpp"
#include "src/dp/modes.hpp"

namespace meshtest::test_support {

/// max |got − want| / max |want| (0 when both are all zero).
inline double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < std::min(got.numel(), want.numel()); ++i) {
    num = std::max(num, std::abs(got.item(i) - want.item(i)));
    den = std::max(den, std::abs(want.item(i)));
  }
  return den == 0 ? num : num / den;
}

/// Naive per-sample weight gradient of a Linear: W_i[o, k] = Σ_t g[i, t, o] a[i, t, k], in f64.
///   a: [B, (T,) din], g: [B, (T,) dout] -> [dout, din] for sample i
inline Tensor naive_sample_weight_grad(const Tensor& a, const Tensor& g, std::int64_t i) {
  const std::int64_t din = a.shape()[a.rank() - 1], dout = g.shape()[g.rank() - 1];
  const std::int64_t t = a.rank() == 3 ? a.shape()[1] : 1;
  Tensor w(Shape{dout, din}, DType::f64);
  for (std::int64_t o = 0; o < dout; ++o) {
    for (std::int64_t k = 0; k < din; ++k) {
      double acc = 0;
      for (std::int64_t s = 0; s < t; ++s) {
        acc += g.item((i * t + s) * dout + o) * a.item((i * t + s) * din + k);
      }
      w.data<double>()[o * din + k] = acc;
    }
  }
  return w;
}

/// Naive per-sample bias gradient Σ_t g[i, t, :].   -> [dout]
inline Tensor naive_sample_bias_grad(const Tensor& g, std::int64_t i) {
  const std::int64_t dout = g.shape()[g.rank() - 1];
  const std::int64_t t = g.rank() == 3 ? g.shape()[1] : 1;
  Tensor b(Shape{dout}, DType::f64);
  for (std::int64_t o = 0; o < dout; ++o) {
    for (std::int64_t s = 0; s < t; ++s) b.data<double>()[o] += g.item((i * t + s) * dout + o);
  }
  return b;
}

inline double sum_sq(const Tensor& t) {
  double s = 0;
  for (std::int64_t j = 0; j < t.numel(); ++j) s += t.item(j) * t.item(j);
  return s;
}

/// The clipped-gradient reference of a batch.
struct DpReference {
  std::vector<double> norms;         ///< ‖∇θ ℓ_i‖
  std::vector<double> coef;          ///< min(1, C / (norm + 1e-6))
  std::vector<Tensor> clipped;       ///< Σ_i c_i ∇ℓ_i (÷ B for mean), f64, per parameter
  std::vector<Tensor> sample_grads;  ///< ∇ℓ_i of every parameter, sample-major (B x params)
};

/// Gradients of sample i alone: the model on x[i:i+1], non_private, sum reduction.
inline std::vector<Tensor> sample_grads(const dp::Sequential& model, const Tensor& x,
                                        const Tensor& y, std::int64_t i, dp::LossKind loss) {
  dp::PrivateModel pm(model, "non_private",
                      {.clip = 1.0, .loss = loss, .reduction = dp::Reduction::sum});
  return pm.compute(x.slice(0, i, 1), y.slice(0, i, 1)).grads;
}

/// The reference, one sample at a time.
inline DpReference dp_reference(const dp::Sequential& model, const Tensor& x, const Tensor& y,
                                const dp::DpOptions& opt) {
  DpReference r;
  const std::int64_t batch = x.shape()[0];
  for (const dp::Param* p : model.parameters()) r.clipped.emplace_back(p->shape, DType::f64);
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::vector<Tensor> g = sample_grads(model, x, y, i, opt.loss);
    double sq = 0;
    for (const Tensor& t : g) sq += sum_sq(t);
    const double n = std::sqrt(sq);
    const double c = std::min(1.0, opt.clip / (n + 1e-6));
    r.norms.push_back(n);
    r.coef.push_back(c);
    for (std::size_t p = 0; p < g.size(); ++p) {
      for (std::int64_t j = 0; j < g[p].numel(); ++j) {
        r.clipped[p].data<double>()[j] += c * g[p].item(j);
      }
      r.sample_grads.push_back(g[p]);
    }
  }
  if (opt.reduction == dp::Reduction::mean && batch > 0) {
    for (Tensor& t : r.clipped) t.vector<double>() /= static_cast<double>(batch);
  }
  return r;
}

inline Tensor as_tensor(const std::vector<double>& v) {
  return Tensor::from_vector(Shape{static_cast<std::int64_t>(v.size())}, v);
}

/// The error model's n (src/check/tolerance.hpp) for the DP results of `model` on x [B, (T,) d]:
/// the terms added to make one element over its whole chain. `layers` counts the reductions of
/// the forward and backward passes: a Linear sums over its inputs forward (+1 for the bias) and
/// its outputs backward, an RMSNorm over its width both ways; `outputs` is the loss's (ce's
/// softmax over the classes).
struct DpTerms {
  std::int64_t norm = 1;     ///< a per-sample norm or clip coefficient: layers + outputs + T²
                             ///< (ghost's Gram sum; direct sums T) + P (each parameter element
                             ///< squared)
  std::int64_t clipped = 1;  ///< a clipped sum Σ_i c_i ∇ℓ_i: norm (through c_i) + B T; also
                             ///< covers a non-private gradient (layers + outputs + B T)
};

inline DpTerms dp_terms(const dp::Sequential& model, const Tensor& x) {
  const std::int64_t batch = x.shape()[0], seq = x.rank() == 3 ? x.shape()[1] : 1;
  std::int64_t layers = 0, params = 0;
  for (const dp::Param* p : model.parameters()) {
    params += p->shape.numel();
    if (p->shape.rank() == 2) {
      layers += p->shape[0] + p->shape[1];  // a Linear's weight [out, in]
    } else if (p->name.ends_with("bias")) {
      layers += 1;
    } else {
      layers += 2 * p->shape[0];  // an RMSNorm's scale [d]
    }
  }
  const std::int64_t outputs = model.out_features(x.shape()[x.rank() - 1]);
  const std::int64_t norm = layers + outputs + seq * seq + params;
  return {.norm = norm, .clipped = norm + batch * seq};
}

/// The magnitude of clip coefficient i's terms, for compare(model) of coefficients computed from
/// norms whose bound is relative to the largest norm: c_i = C / (‖∇ℓ_i‖ + 1e-6) carries its
/// norm's relative error, so its bound scales with c_i · max_j ‖∇ℓ_j‖ / ‖∇ℓ_i‖ (c_i itself for
/// a zero norm, whose c_i = 1 exactly).
inline Tensor coef_scale(const Tensor& norms, const Tensor& coef) {
  double largest = 0;
  for (std::int64_t i = 0; i < norms.numel(); ++i) largest = std::max(largest, norms.item(i));
  Tensor s(coef.shape(), DType::f64);
  for (std::int64_t i = 0; i < coef.numel(); ++i) {
    const double n = norms.item(i), c = coef.item(i);
    s.span<double>()[static_cast<std::size_t>(i)] = n > 0 ? c * largest / n : c;
  }
  return s;
}
inline Tensor coef_scale(const DpReference& r) {
  return coef_scale(as_tensor(r.norms), as_tensor(r.coef));
}

/// Expects `got` within `m` of `want` (src/check/tolerance.hpp), with each element's `scale`
/// (default: the tensor's scale max |want|).
inline void expect_within(const Tensor& want, const Tensor& got, const ErrorModel& m,
                          const std::string& what,
                          const std::optional<Tensor>& scale = std::nullopt) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Comparison c = scale ? compare(want, got, m, *scale) : compare(want, got, m);
  EXPECT_TRUE(c.passed) << what << ": " << c;
}

/// max |t| over the elements (0 when empty).
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (std::int64_t j = 0; j < t.numel(); ++j) m = std::max(m, std::abs(t.item(j)));
  return m;
}

}  // namespace meshtest::test_support
