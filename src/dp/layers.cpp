// Forward and backward of the DP layers; norms through src/dp/norms, grads through src/ops.
#include "src/dp/layers.hpp"

#include "src/dp/bookkeeping.hpp"
#include "src/dp/norms.hpp"
#include "src/dp/real.hpp"
#include "src/ops/gelu.hpp"
#include "src/ops/linear.hpp"
#include "src/ops/linear_grad.hpp"
#include "src/ops/rms_norm.hpp"
#include "src/ops/rms_norm_grad.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dp {
namespace {

// ctx.norm_sq += sq · ctx.norm_scale² (the norms of each sample's own loss).
void add_norms(BackwardContext& ctx, const Tensor& sq) {
  MESHTEST_CHECK(ctx.norm_sq.shape() == sq.shape() && ctx.norm_sq.dtype() == sq.dtype(),
                 "backward: norm accumulator is {} but the layer gives {}", describe(ctx.norm_sq),
                 describe(sq));
  visit_real(sq.dtype(), "backward", [&]<class S>(type_tag<S>) {
    const S s = static_cast<S>(ctx.norm_scale);
    ctx.norm_sq.vector<S>() += sq.vector<S>() * (s * s);
  });
}

Tensor sum_squares(const Tensor& a, const Tensor& b) {
  Tensor out = a;
  visit_real(a.dtype(), "backward",
             [&]<class S>(type_tag<S>) { out.vector<S>() += b.vector<S>(); });
  return out;
}

const Tensor& live(const Param& p) {
  MESHTEST_CHECK(!is_unset(p.value),
                 "{}: parameter is not materialised (freed by FSDP and not gathered)", p.name);
  return p.value;
}

}  // namespace

void Layer::bookkeeping_grads(const Tensor& coef) {
  for (Param& p : params_) {
    MESHTEST_CHECK(!is_unset(p.grad_sample) || coef.numel() == 0,
                   "{}: book-keeping needs the per-sample gradients kept by backward", p.name);
    p.grad =
        is_unset(p.grad_sample) ? Tensor(p.shape, coef.dtype()) : clipped_sum(p.grad_sample, coef);
  }
}

void Layer::release() {
  input_ = Tensor();
  for (Param& p : params_) p.grad_sample = Tensor();
}

// ----------------------------------------------------------------------------- Linear

Linear::Linear(Tensor weight, Tensor bias, int index) : Layer("linear") {
  MESHTEST_CHECK(
      weight.rank() == 2 && (weight.dtype() == DType::f32 || weight.dtype() == DType::f64),
      "Linear {}: weight is {}, expected f32 or f64 [out, in]", index, describe(weight));
  const std::int64_t out = weight.shape()[0];
  params_.push_back({.name = fmt::format("{}.weight", index),
                     .shape = weight.shape(),
                     .dtype = weight.dtype(),
                     .value = std::move(weight)});
  if (!is_unset(bias)) {
    MESHTEST_CHECK(bias.shape() == Shape{out} && bias.dtype() == params_[0].value.dtype(),
                   "Linear {}: bias is {}, expected {}[{}]", index, describe(bias),
                   params_[0].value.dtype(), out);
    params_.push_back({.name = fmt::format("{}.bias", index),
                       .shape = bias.shape(),
                       .dtype = bias.dtype(),
                       .value = std::move(bias)});
  }
}

std::int64_t Linear::out_features(std::int64_t in) const {
  const Shape& w = params_[0].shape;
  MESHTEST_CHECK(in == w[1], "{}: input has {} features, expected {} (weight {})", params_[0].name,
                 in, w[1], w);
  return w[0];
}

Tensor Linear::forward(const Tensor& x) {
  out_features(x.rank() >= 1 ? x.shape()[x.rank() - 1] : -1);
  input_ = x;
  perf::OpScope scope("linear");
  scope.input(x);
  Tensor y =
      has_bias() ? linear(x, live(params_[0]), live(params_[1])) : linear(x, live(params_[0]));
  const double rows = static_cast<double>(x.shape().outer(x.rank() - 1));
  scope.flops(2.0 * rows * static_cast<double>(params_[0].shape.numel())).output(y);
  return y;
}

Tensor Linear::input_grad(const Tensor& grad_out, const BackwardContext& ctx) const {
  if (!ctx.input_grad) return {};
  return linear_backward(input_, live(params_[0]), grad_out,
                         {.input = true, .weight = false, .bias = false})
      .input;
}

void Linear::instantiate(const Tensor& grad_out, BackwardContext& ctx) {
  Tensor per_w = per_sample_weight_grads(input_, grad_out);
  Tensor per_b = has_bias() ? per_sample_bias_grads(grad_out) : Tensor();
  if (ctx.norms) {
    add_norms(ctx, has_bias() ? sum_squares(per_sample_norm_sq(per_w), per_sample_norm_sq(per_b))
                              : per_sample_norm_sq(per_w));
  }
  params_[0].grad_sample = std::move(per_w);
  if (has_bias()) params_[1].grad_sample = std::move(per_b);
}

Tensor Linear::backward(const Tensor& grad_out, BackwardContext& ctx) {
  const LinearBackwardOptions grads{.input = false, .weight = true, .bias = has_bias()};
  if (ctx.per_sample) {
    instantiate(grad_out, ctx);
  } else {
    if (ctx.norms) {
      const Tensor sq = ghost_norm_sq(input_, grad_out);
      add_norms(ctx, has_bias() ? sum_squares(sq, bias_norm_sq(grad_out)) : sq);
    }
    if (ctx.grads) {
      LinearGrads g = linear_backward(input_, live(params_[0]), grad_out, grads);
      params_[0].grad = std::move(g.weight);
      if (has_bias()) params_[1].grad = std::move(g.bias);
    } else {
      ctx.all_grads = false;
    }
  }
  return input_grad(grad_out, ctx);
}

// ----------------------------------------------------------------------------- FusedLinear

Tensor FusedLinear::backward(const Tensor& grad_out, BackwardContext& ctx) {
  if (ctx.per_sample) return Linear::backward(grad_out, ctx);
  const SeqDims d = seq_dims(input_, "FusedLinear backward", "input");
  const Shape& ws = params_[0].shape;
  const NormMethod method = hybrid_method(d.seq, ws[1], ws[0]);
  if (ctx.keep && method == NormMethod::direct && ws[1] <= d.seq) {
    // Book-keeping in the direct regime: the weight-grad pass builds each sample's A_iᵀG_i,
    // whose squares give the norm; they are kept instead of G (no larger, as d_in <= T), so
    // the clipped sum is Σ_i c_i A_iᵀG_i without a second GEMM.
    kept_grad_ = Tensor();
    instantiate(grad_out, ctx);
    ctx.all_grads = false;
    return input_grad(grad_out, ctx);
  }
  const bool fused_grad =
      ctx.norms && method == NormMethod::direct && (ctx.grads || ctx.grads_if_free);
  if (ctx.norms) {
    Tensor sq;
    if (fused_grad) {
      params_[0].grad = Tensor(ws, input_.dtype());
      sq = direct_norm_sq(input_, grad_out, &params_[0].grad);
    } else {
      sq = method == NormMethod::ghost ? ghost_norm_sq(input_, grad_out)
                                       : direct_norm_sq(input_, grad_out);
    }
    add_norms(ctx, has_bias() ? sum_squares(sq, bias_norm_sq(grad_out)) : sq);
  }
  const bool gemm_grad = ctx.grads && !fused_grad;
  if (gemm_grad || (fused_grad && has_bias())) {
    LinearGrads g = linear_backward(input_, live(params_[0]), grad_out,
                                    {.input = false, .weight = gemm_grad, .bias = has_bias()});
    if (gemm_grad) params_[0].grad = std::move(g.weight);
    if (has_bias()) params_[1].grad = std::move(g.bias);
  }
  if (!gemm_grad && !fused_grad) ctx.all_grads = false;
  if (ctx.keep) kept_grad_ = grad_out;
  return input_grad(grad_out, ctx);
}

void FusedLinear::bookkeeping_grads(const Tensor& coef) {
  if (is_unset(kept_grad_)) return Layer::bookkeeping_grads(coef);  // kept per-sample grads
  MESHTEST_CHECK(!is_unset(input_), "{}: book-keeping needs a backward with keep = true first",
                 params_[0].name);
  if (has_bias()) params_[1].grad = clipped_bias_grad(kept_grad_, coef);
  params_[0].grad = clipped_weight_grad(input_, std::move(kept_grad_), coef);
  kept_grad_ = Tensor();
}

void FusedLinear::drop_input() {
  if (is_unset(kept_grad_)) input_ = Tensor();  // (diag(c) G)ᵀ A still needs A
}

void FusedLinear::release() {
  Layer::release();
  kept_grad_ = Tensor();
}

// ----------------------------------------------------------------------------- activations

Tensor Relu::forward(const Tensor& x) {
  input_ = x;
  return relu(x);
}

Tensor Relu::backward(const Tensor& grad_out, BackwardContext& ctx) {
  return ctx.input_grad ? relu_backward(input_, grad_out) : Tensor();
}

Tensor Gelu::forward(const Tensor& x) {
  input_ = x;
  return gelu(x);
}

Tensor Gelu::backward(const Tensor& grad_out, BackwardContext& ctx) {
  return ctx.input_grad ? gelu_backward(input_, grad_out) : Tensor();
}

// ----------------------------------------------------------------------------- RmsNorm

RmsNorm::RmsNorm(Tensor scale, int index) : Layer("rmsnorm") {
  MESHTEST_CHECK(scale.rank() == 1 && (scale.dtype() == DType::f32 || scale.dtype() == DType::f64),
                 "RMSNorm {}: scale is {}, expected f32 or f64 [d]", index, describe(scale));
  params_.push_back({.name = fmt::format("{}.weight", index),
                     .shape = scale.shape(),
                     .dtype = scale.dtype(),
                     .value = std::move(scale)});
}

std::int64_t RmsNorm::out_features(std::int64_t in) const {
  MESHTEST_CHECK(in == params_[0].shape[0], "{}: input has {} features, expected {}",
                 params_[0].name, in, params_[0].shape[0]);
  return in;
}

Tensor RmsNorm::forward(const Tensor& x) {
  out_features(x.rank() >= 1 ? x.shape()[x.rank() - 1] : -1);
  input_ = x;
  perf::OpScope scope("rms_norm");
  scope.input(x);
  Tensor y = rms_norm(x, live(params_[0]));
  scope.output(y);
  return y;
}

Tensor RmsNorm::backward(const Tensor& grad_out, BackwardContext& ctx) {
  const RmsNormGrads g = rms_norm_backward(input_, live(params_[0]), grad_out);
  const SeqDims d = seq_dims(input_, "RMSNorm backward", "input");
  Param& p = params_[0];
  Tensor per_sample(Shape{d.batch, d.features}, input_.dtype());
  visit_real(input_.dtype(), "RMSNorm backward", [&]<class S>(type_tag<S>) {
    const auto rows = g.scale_rows.matrix<S>();
    auto ps = per_sample.matrix<S>();
    for (std::int64_t i = 0; i < d.batch; ++i) {
      ps.row(i) = rows.middleRows(i * d.seq, d.seq).colwise().sum();
    }
    if (ctx.grads || ctx.grads_if_free) {
      p.grad = Tensor(p.shape, input_.dtype());
      p.grad.vector<S>() = rows.colwise().sum().transpose();
    }
  });
  if (ctx.norms) add_norms(ctx, per_sample_norm_sq(per_sample));
  if (ctx.per_sample || ctx.keep) p.grad_sample = std::move(per_sample);
  return ctx.input_grad ? g.input : Tensor();
}

}  // namespace meshtest::dp
