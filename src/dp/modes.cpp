// The five built-in DP modes and their registry.
#include "src/dp/modes.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>

#include "src/dp/clip.hpp"
#include "src/dp/norms.hpp"
#include "src/dp/real.hpp"

namespace meshtest::dp {
namespace {

// The forward pass and the loss of the local samples.
struct Forward {
  LossOutput loss;
  std::int64_t batch = 0;
  double scale = 1;  // B for mean: G · B are the grads of each sample's own loss
};

Forward forward(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                const StepHooks& hooks) {
  const Tensor out = model.forward(x, hooks.layers);
  const std::int64_t batch = x.shape()[0];
  const std::int64_t divisor = opt.global_batch >= 0 ? opt.global_batch : batch;
  Forward f{.loss = loss_and_grad(out, y, opt.loss, opt.reduction, divisor), .batch = batch};
  if (opt.reduction == Reduction::mean)
    f.scale = static_cast<double>(std::max<std::int64_t>(divisor, 1));
  return f;
}

BackwardContext norm_context(const Forward& f, DType dtype) {
  return {.grads = false,
          .norms = true,
          .norm_scale = f.scale,
          .norm_sq = Tensor(Shape{f.batch}, dtype)};
}

std::vector<Tensor> take_grads(Sequential& model) {
  std::vector<Tensor> out;
  for (Param* p : model.parameters()) {
    out.push_back(is_unset(p->grad) ? Tensor(p->shape, model.dtype()) : std::move(p->grad));
    p->grad = Tensor();
  }
  return out;
}

// Norms and clip coefficients from the accumulated squared norms.
void finish_norms(DpGrads& r, const BackwardContext& ctx, const DpOptions& opt) {
  r.norms = norms_from_squares(ctx.norm_sq);
  r.coef = clip_coefficients(r.norms, opt.clip);
}

// Output grads with sample i's rows scaled by c_i: the backward of Σ_i c_i ℓ_i.
Tensor scale_samples(const Tensor& g, const Tensor& coef) {
  Tensor out = g;
  const std::int64_t batch = g.shape()[0];
  visit_real(g.dtype(), "scale_samples", [&]<class S>(type_tag<S>) {
    const std::int64_t per = batch == 0 ? 0 : g.numel() / batch;
    Eigen::Map<RowMatrix<S>> m(out.data<S>(), batch, per);
    m.array().colwise() *= coef.vector<S>().array();
  });
  return out;
}

bool all_of(const StepHooks& h, bool v) { return h.all_of ? h.all_of(v) : v; }

DpGrads run_non_private(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                        const StepHooks& hooks) {
  const Forward f = forward(model, x, y, opt, hooks);
  BackwardContext ctx{.grads = true, .last_pass = true};
  model.backward(f.loss.grad, ctx, hooks.layers);
  return {.grads = take_grads(model), .loss = f.loss.total};
}

// One backward that keeps per-sample gradients (hooks) or A and G (fused_bk), then the clipped
// sum per layer from what it kept.
DpGrads run_one_pass(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                     const StepHooks& hooks, bool per_sample) {
  const Forward f = forward(model, x, y, opt, hooks);
  BackwardContext ctx = norm_context(f, model.dtype());
  ctx.last_pass = true;
  ctx.per_sample = per_sample;
  ctx.keep = !per_sample;
  model.backward(f.loss.grad, ctx, hooks.layers);
  DpGrads r{.loss = f.loss.total};
  finish_norms(r, ctx, opt);
  for (std::size_t i = 0; i < model.size(); ++i) {
    model.layer(i).bookkeeping_grads(r.coef);
    model.layer(i).release();  // what it kept is summed: free it before the next layer's sum
  }
  r.grads = take_grads(model);
  return r;
}

DpGrads run_hooks(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                  const StepHooks& hooks) {
  return run_one_pass(model, x, y, opt, hooks, true);
}

// Norm pass, then a second backward of Σ_i c_i ℓ_i (ghost; fused unless the first pass already
// has every gradient and no sample on any rank is clipped).
DpGrads run_two_pass(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                     const StepHooks& hooks, bool grads_if_free) {
  const Forward f = forward(model, x, y, opt, hooks);
  BackwardContext ctx = norm_context(f, model.dtype());
  ctx.grads_if_free = grads_if_free;
  model.backward(f.loss.grad, ctx, hooks.layers);
  DpGrads r{.loss = f.loss.total};
  finish_norms(r, ctx, opt);
  bool none_clipped = true;
  visit_real(r.coef.dtype(), "mode", [&]<class S>(type_tag<S>) {
    none_clipped = (r.coef.vector<S>().array() == S(1)).all();
  });
  const bool done = grads_if_free && all_of(hooks, ctx.all_grads && none_clipped);
  if (!done) {
    BackwardContext second{.grads = true, .last_pass = true};
    model.backward(scale_samples(f.loss.grad, r.coef), second, hooks.layers);
  }
  r.grads = take_grads(model);
  return r;
}

DpGrads run_ghost(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                  const StepHooks& hooks) {
  return run_two_pass(model, x, y, opt, hooks, false);
}

DpGrads run_fused(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                  const StepHooks& hooks) {
  return run_two_pass(model, x, y, opt, hooks, true);
}

DpGrads run_fused_bk(Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt,
                     const StepHooks& hooks) {
  return run_one_pass(model, x, y, opt, hooks, false);
}

std::map<std::string, Mode, std::less<>>& registry() {
  static std::map<std::string, Mode, std::less<>> modes = [] {
    std::map<std::string, Mode, std::less<>> m;
    const auto add = [&](Mode mode) { m.emplace(mode.name, std::move(mode)); };
    add({"non_private", "ordinary training: no clipping, no norms", false, &run_non_private});
    add({"hooks", "per-sample gradients instantiated, norms and clipped sum from them", false,
         &run_hooks});
    add({"ghost", "ghost norms (Gram) in a first backward, second backward of Σ c_i ℓ_i", false,
         &run_ghost});
    add({"fused", "norms inside the Linear backward (hybrid rule), second pass for the clipped sum",
         true, &run_fused});
    add({"fused_bk", "one backward keeping A and G; (diag(c) G)ᵀ A per layer after the norms", true,
         &run_fused_bk});
    return m;
  }();
  return modes;
}

}  // namespace

void register_mode(Mode mode) {
  MESHTEST_CHECK(!mode.name.empty() && mode.run != nullptr,
                 "register_mode: a mode needs a name and a function");
  MESHTEST_CHECK(!registry().contains(mode.name), "register_mode: mode '{}' is already registered",
                 mode.name);
  registry().emplace(mode.name, std::move(mode));
}

const Mode& find_mode(std::string_view name) {
  const auto it = registry().find(name);
  MESHTEST_CHECK(it != registry().end(), "unknown DP mode '{}' (registered: {})", name,
                 fmt::join(mode_names(), ", "));
  return it->second;
}

std::vector<std::string> mode_names() {
  std::vector<std::string> out;
  for (const auto& [name, mode] : registry()) out.push_back(name);
  return out;
}

void check_batch(const Sequential& model, const Tensor& x, const Tensor& y, const DpOptions& opt) {
  check_clip(opt.clip, "DP step");
  MESHTEST_CHECK(x.rank() == 2 || x.rank() == 3,
                 "DP step: inputs have shape {}, expected [B, d] "
                 "or [B, T, d]",
                 x.shape());
  seq_dims(x, "DP step", "inputs");
  MESHTEST_CHECK(x.dtype() == model.dtype(), "DP step: inputs are {} but the model is {}",
                 x.dtype(), model.dtype());
  const std::int64_t out = model.out_features(x.shape()[x.rank() - 1]);
  const Shape out_shape = x.shape().with(x.rank() - 1, out);
  if (opt.loss == LossKind::mse) {
    MESHTEST_CHECK(y.shape() == out_shape && y.dtype() == x.dtype(),
                   "DP step: mse targets are {}, expected {}{} (the output's shape)", describe(y),
                   x.dtype(), out_shape);
  } else {
    const Shape want = x.rank() == 2 ? Shape{x.shape()[0]} : Shape{x.shape()[0], x.shape()[1]};
    MESHTEST_CHECK(y.shape() == want && (y.dtype() == DType::i64 || y.dtype() == DType::i32),
                   "DP step: ce targets are {}, expected i64 or i32 classes of shape {}",
                   describe(y), want);
  }
}

PrivateModel::PrivateModel(Sequential model, std::string_view mode, DpOptions opt)
    : model_(std::move(model)), mode_(&find_mode(mode)), opt_(opt) {
  check_clip(opt_.clip, "PrivateModel");
  if (mode_->fused_layers) replace_linear_with_fused(model_);
}

DpGrads PrivateModel::compute(const Tensor& x, const Tensor& y, const StepHooks& hooks) {
  check_batch(model_, x, y, opt_);
  DpGrads r = mode_->run(model_, x, y, opt_, hooks);
  model_.release();
  return r;
}

}  // namespace meshtest::dp
