// dp_model (GPU): the layers' forward and backward on DeviceTensors, queued on the Blas's stream
// with every temporary allocated and freed in its order (one wait where the host reads the loss
// or the norms, one at the end), and the five modes' passes as src/dp/modes.cpp runs them.
#include "src/gpu/dp_model.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "src/dp/clip.hpp"
#include "src/dp/layers.hpp"
#include "src/dp/norms.hpp"
#include "src/dp/real.hpp"
#include "src/gpu/dp.hpp"
#include "src/gpu/dp_model_kernel.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu::dp {

namespace md = meshtest::dp;

/// One layer on the GPU: its kind, parameters (weight before bias), what forward cached and
/// what backward kept.
struct Model::Layer {
  enum class Kind { linear, relu, gelu, rmsnorm } kind = Kind::linear;
  std::vector<std::string> names;
  std::vector<DeviceTensor> params;
  std::vector<Shape> shapes;  ///< the parameters' (kept while a caller frees them: FSDP)
  std::vector<std::optional<DeviceTensor>> grads;  ///< per parameter, where set
  std::vector<DeviceTensor> grad_samples;  ///< per-sample grads kept (hooks, fused_bk direct)
  DeviceTensor input;                      ///< forward's input
  Shape input_shape;
  DeviceTensor kept_grad;  ///< fused_bk: the output grads G
  bool has_kept = false;
};

namespace {

using Layer = Model::Layer;
using Kind = Layer::Kind;

constexpr double kRmsEps = 1e-5;  // the CPU RmsNorm's

/// What one backward pass computes (meshtest::dp::BackwardContext on the GPU).
struct Ctx {
  bool input_grad = true, grads = true, grads_if_free = false, norms = false;
  bool per_sample = false, keep = false, all_grads = true;
  bool fused = false;  ///< Linear layers take FusedLinear's backward
  double norm_scale = 1;
  std::optional<DeviceTensor> norm_sq = std::nullopt;  ///< [B]
};

bool f64_of(const DeviceTensor& t) { return t.dtype() == DType::f64; }

constexpr Finish kQueued = Finish::queued;

/// A temporary with unspecified elements, allocated and freed in the order of blas's stream.
DeviceTensor queued(Blas& blas, Shape shape, DType dtype) {
  return DeviceTensor(std::move(shape), dtype, StreamOrdered{blas.shared_stream()});
}

/// A copy of t made on blas's stream (t complete, or queued on that stream).
DeviceTensor queued_copy(Blas& blas, const DeviceTensor& t) {
  DeviceTensor out = queued(blas, t.shape(), t.dtype());
  if (out.nbytes() > 0) {
    MESHTEST_CUDA_CHECK(cudaMemcpyAsync(out.bytes(), t.bytes(), t.nbytes(),
                                        cudaMemcpyDeviceToDevice, blas.stream()));
  }
  return out;
}

/// The same, zero-filled on the stream.
DeviceTensor queued_zeros(Blas& blas, Shape shape, DType dtype) {
  DeviceTensor out = queued(blas, std::move(shape), dtype);
  if (out.nbytes() > 0) {
    MESHTEST_CUDA_CHECK(cudaMemsetAsync(out.bytes(), 0, out.nbytes(), blas.stream()));
  }
  return out;
}

/// rows and features of a [B, d] or [B, T, d] shape.
std::pair<std::int64_t, std::int64_t> rows_features(const Shape& s) {
  return {s.outer(s.rank() - 1), s[s.rank() - 1]};
}

/// ctx.norm_sq += s² · sq.
void add_norms(Blas& blas, Ctx& ctx, const DeviceTensor& sq) {
  const double s = ctx.norm_scale;
  MESHTEST_CUDA_CHECK(detail::launch_axpy(f64_of(sq), ctx.norm_sq->bytes(), sq.bytes(), s * s,
                                          sq.numel(), blas.stream()));
}

/// Σ_i c_i P_i of per-sample tensors P [B, ...]: [...].
DeviceTensor clipped_sum(Blas& blas, const DeviceTensor& per_sample, const DeviceTensor& coef) {
  const std::int64_t batch = per_sample.shape()[0];
  const std::int64_t n = batch == 0 ? 0 : per_sample.numel() / batch;
  std::vector<std::int64_t> dims;
  for (int k = 1; k < per_sample.rank(); ++k) dims.push_back(per_sample.shape()[k]);
  DeviceTensor out = queued_zeros(blas, Shape(dims), per_sample.dtype());
  gemm(blas, f64_of(per_sample), false, false, 1, n, batch, coef.bytes(), per_sample.bytes(),
       out.bytes());
  return out;
}

/// Sums of consecutive rows [groups, seq, d] -> [groups, d] (per sample: groups = B), or with
/// `total` all rows (groups = 1) -> [d].
DeviceTensor group_sums(Blas& blas, const DeviceTensor& rows, std::int64_t groups, std::int64_t seq,
                        std::int64_t d, bool total = false) {
  DeviceTensor out = queued_zeros(blas, total ? Shape{d} : Shape{groups, d}, rows.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_group_sums(f64_of(rows), rows.bytes(), groups, seq, d,
                                                out.bytes(), blas.stream()));
  return out;
}

/// Σ_i ‖P_i‖² of per-sample tensors P [B, ...].
DeviceTensor sample_norm_sq(Blas& blas, const DeviceTensor& per_sample) {
  const std::int64_t batch = per_sample.shape()[0];
  DeviceTensor out = queued_zeros(blas, Shape{batch}, per_sample.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_sample_dots(
      f64_of(per_sample), per_sample.bytes(), per_sample.bytes(), batch,
      batch == 0 ? 0 : per_sample.numel() / batch, false, out.bytes(), blas.stream()));
  return out;
}

DeviceTensor sum_of(Blas& blas, DeviceTensor a, const DeviceTensor& b) {
  MESHTEST_CUDA_CHECK(
      detail::launch_axpy(f64_of(a), a.bytes(), b.bytes(), 1.0, a.numel(), blas.stream()));
  return a;
}

// ------------------------------------------------------------------------------------ Linear

bool has_bias(const Layer& l) { return l.params.size() == 2; }

DeviceTensor linear_forward(Blas& blas, Layer& l, const DeviceTensor& x) {
  const auto [rows, in] = rows_features(x.shape());
  const std::int64_t out = l.params[0].shape()[0];
  MESHTEST_CHECK(in == l.params[0].shape()[1], "{}: input has {} features, expected {}", l.names[0],
                 in, l.params[0].shape()[1]);
  DeviceTensor y = queued(blas, x.shape().with(x.rank() - 1, out), x.dtype());
  perf::OpScope scope("linear");
  gemm(blas, f64_of(x), false, true, rows, out, in, x.bytes(), l.params[0].bytes(), y.bytes());
  if (has_bias(l)) {
    MESHTEST_CUDA_CHECK(detail::launch_add_bias(f64_of(x), y.bytes(), l.params[1].bytes(), rows,
                                                out, blas.stream()));
  }
  scope.flops(2.0 * static_cast<double>(rows * out * in));
  return y;
}

DeviceTensor linear_input_grad(Blas& blas, const Layer& l, const DeviceTensor& g, const Ctx& ctx) {
  if (!ctx.input_grad) return {};
  const auto [rows, out] = rows_features(g.shape());
  const std::int64_t in = l.params[0].shape()[1];
  DeviceTensor gx = queued_zeros(blas, l.input_shape, g.dtype());  // zero: no output features
  gemm(blas, f64_of(g), false, false, rows, in, out, g.bytes(), l.params[0].bytes(), gx.bytes());
  return gx;
}

/// Param grads by GEMM: weight Gᵀ A, bias Σ rows.
void linear_param_grads(Blas& blas, Layer& l, const DeviceTensor& g, bool weight) {
  const auto [rows, out] = rows_features(g.shape());
  const std::int64_t in = l.params[0].shape()[1];
  if (weight) {
    l.grads[0] = queued_zeros(blas, l.params[0].shape(), g.dtype());  // zero: no rows
    gemm(blas, f64_of(g), true, false, out, in, rows, g.bytes(), l.input.bytes(),
         l.grads[0]->bytes());
  }
  if (has_bias(l)) l.grads[1] = group_sums(blas, g, 1, rows, out, true);
}

/// The per-sample grads in grad_samples (and their norms when asked).
void linear_instantiate(Blas& blas, Layer& l, const DeviceTensor& g, Ctx& ctx) {
  const md::SeqDims d = md::seq_dims(g.shape(), "gpu Linear backward", "grad_out");
  l.grad_samples.assign(l.params.size(), DeviceTensor());
  l.grad_samples[0] = per_sample_weight_grads(blas, l.input, g, kQueued);
  if (has_bias(l)) l.grad_samples[1] = group_sums(blas, g, d.batch, d.seq, d.features);
  if (ctx.norms) {
    DeviceTensor sq = sample_norm_sq(blas, l.grad_samples[0]);
    if (has_bias(l)) sq = sum_of(blas, std::move(sq), sample_norm_sq(blas, l.grad_samples[1]));
    add_norms(blas, ctx, sq);
  }
}

DeviceTensor linear_backward(Blas& blas, Layer& l, const DeviceTensor& g, Ctx& ctx) {
  if (ctx.per_sample) {
    linear_instantiate(blas, l, g, ctx);
    return linear_input_grad(blas, l, g, ctx);
  }
  if (!ctx.fused) {  // Linear: ghost norms, grads by GEMM
    if (ctx.norms) {
      DeviceTensor sq = ghost_norm_sq(blas, l.input, g, kQueued);
      if (has_bias(l)) sq = sum_of(blas, std::move(sq), bias_norm_sq(blas, g, kQueued));
      add_norms(blas, ctx, sq);
    }
    if (ctx.grads) {
      linear_param_grads(blas, l, g, true);
    } else {
      ctx.all_grads = false;
    }
    return linear_input_grad(blas, l, g, ctx);
  }
  // FusedLinear: the hybrid rule.
  const md::SeqDims d = md::seq_dims(l.input.shape(), "gpu FusedLinear backward", "input");
  const Shape& ws = l.params[0].shape();
  const md::NormMethod method = md::hybrid_method(d.seq, ws[1], ws[0]);
  if (ctx.keep && method == md::NormMethod::direct && ws[1] <= d.seq) {
    l.has_kept = false;
    linear_instantiate(blas, l, g, ctx);
    ctx.all_grads = false;
    return linear_input_grad(blas, l, g, ctx);
  }
  const bool fused_grad =
      ctx.norms && method == md::NormMethod::direct && (ctx.grads || ctx.grads_if_free);
  if (ctx.norms) {
    DeviceTensor sq;
    if (fused_grad) {
      l.grads[0] = queued_zeros(blas, ws, l.input.dtype());
      sq = direct_norm_sq(blas, l.input, g, &*l.grads[0], kQueued);
    } else {
      sq = method == md::NormMethod::ghost ? ghost_norm_sq(blas, l.input, g, kQueued)
                                           : direct_norm_sq(blas, l.input, g, nullptr, kQueued);
    }
    if (has_bias(l)) sq = sum_of(blas, std::move(sq), bias_norm_sq(blas, g, kQueued));
    add_norms(blas, ctx, sq);
  }
  const bool gemm_grad = ctx.grads && !fused_grad;
  if (gemm_grad || (fused_grad && has_bias(l))) linear_param_grads(blas, l, g, gemm_grad);
  if (!gemm_grad && !fused_grad) ctx.all_grads = false;
  if (ctx.keep) {
    l.kept_grad = queued_copy(blas, g);
    l.has_kept = true;
  }
  return linear_input_grad(blas, l, g, ctx);
}

// ------------------------------------------------------------------------------ the others

DeviceTensor rms_norm_forward(Blas& blas, const Layer& l, const DeviceTensor& x) {
  const auto [rows, d] = rows_features(x.shape());
  MESHTEST_CHECK(d == l.params[0].numel(), "{}: input has {} features, expected {}", l.names[0], d,
                 l.params[0].numel());
  DeviceTensor y = queued(blas, x.shape(), x.dtype());
  perf::OpScope scope("rms_norm");
  MESHTEST_CUDA_CHECK(detail::launch_rms_norm_rows(f64_of(x), x.bytes(), l.params[0].bytes(),
                                                   y.bytes(), rows, d, kRmsEps, blas.stream()));
  return y;
}

DeviceTensor rms_norm_backward(Blas& blas, Layer& l, const DeviceTensor& g, Ctx& ctx) {
  const md::SeqDims d = md::seq_dims(l.input.shape(), "gpu RMSNorm backward", "input");
  const std::int64_t rows = d.batch * d.seq;
  DeviceTensor gx = ctx.input_grad ? queued(blas, g.shape(), g.dtype()) : DeviceTensor();
  DeviceTensor scale_rows = queued(blas, Shape{rows, d.features}, g.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_rms_norm_rows_backward(
      f64_of(g), l.input.bytes(), l.params[0].bytes(), g.bytes(),
      ctx.input_grad ? gx.bytes() : nullptr, scale_rows.bytes(), rows, d.features, kRmsEps,
      blas.stream()));
  DeviceTensor per_sample = group_sums(blas, scale_rows, d.batch, d.seq, d.features);
  if (ctx.grads || ctx.grads_if_free)
    l.grads[0] = group_sums(blas, scale_rows, 1, rows, d.features, true);
  if (ctx.norms) add_norms(blas, ctx, sample_norm_sq(blas, per_sample));
  if (ctx.per_sample || ctx.keep) l.grad_samples = {std::move(per_sample)};
  return gx;
}

DeviceTensor activation(Blas& blas, const Layer& l, const DeviceTensor& x) {
  DeviceTensor y = queued(blas, x.shape(), x.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_activation(f64_of(x), l.kind == Kind::gelu, x.bytes(),
                                                y.bytes(), x.numel(), blas.stream()));
  return y;
}

DeviceTensor activation_backward(Blas& blas, const Layer& l, const DeviceTensor& g,
                                 const Ctx& ctx) {
  if (!ctx.input_grad) return {};
  DeviceTensor gx = queued(blas, g.shape(), g.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_activation_backward(f64_of(g), l.kind == Kind::gelu,
                                                         l.input.bytes(), g.bytes(), gx.bytes(),
                                                         g.numel(), blas.stream()));
  return gx;
}

/// Book-keeping: grads = Σ_i c_i (sample i's gradient) from what backward kept.
void bookkeeping_grads(Blas& blas, Layer& l, const DeviceTensor& coef) {
  if (l.kind == Kind::linear && l.has_kept) {
    if (has_bias(l)) l.grads[1] = clipped_bias_grad(blas, l.kept_grad, coef, kQueued);
    l.grads[0] = clipped_weight_grad(blas, l.input, l.kept_grad, coef, kQueued);
    return;
  }
  for (std::size_t p = 0; p < l.params.size(); ++p) {
    l.grads[p] = p < l.grad_samples.size() ? clipped_sum(blas, l.grad_samples[p], coef)
                                           : queued_zeros(blas, l.shapes[p], coef.dtype());
  }
}

void release(Layer& l) {
  l.input = DeviceTensor();
  l.kept_grad = DeviceTensor();
  l.has_kept = false;
  l.grad_samples.clear();
}

/// Scales sample i's rows of g [B, ...] by coef[i].
DeviceTensor scale_samples(Blas& blas, const DeviceTensor& g, const DeviceTensor& coef) {
  const std::int64_t batch = g.shape()[0];
  DeviceTensor out = queued(blas, g.shape(), g.dtype());
  MESHTEST_CUDA_CHECK(detail::launch_scale_samples(f64_of(g), g.bytes(), coef.bytes(), batch, 1,
                                                   batch == 0 ? 0 : g.numel() / batch, out.bytes(),
                                                   blas.stream()));
  return out;
}

}  // namespace

Model::Model(Blas& blas, const md::Sequential& host) : blas_(&blas), dtype_(host.dtype()) {
  const DeviceGuard guard(blas.device());
  for (std::size_t i = 0; i < host.size(); ++i) {
    const md::Layer& h = host.layer(i);
    Layer l;
    const std::string& k = h.kind();
    if (k == "linear" || k == "fused_linear") {
      l.kind = Kind::linear;
    } else if (k == "relu") {
      l.kind = Kind::relu;
    } else if (k == "gelu") {
      l.kind = Kind::gelu;
    } else if (k == "rmsnorm") {
      l.kind = Kind::rmsnorm;
    } else {
      MESHTEST_CHECK(false, "gpu dp::Model: layer {} is a '{}', which the GPU model lacks", i, k);
    }
    for (const md::Param& p : h.params()) {
      MESHTEST_CHECK(!md::is_unset(p.value), "gpu dp::Model: parameter {} is not materialised",
                     p.name);
      l.names.push_back(p.name);
      l.shapes.push_back(p.value.shape());
      l.params.push_back(DeviceTensor::from_host(p.value));
    }
    l.grads.resize(l.params.size());
    layers_.push_back(std::move(l));
  }
}

Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

std::vector<Tensor> Model::parameters() const {
  std::vector<Tensor> out;
  for (const Layer& l : layers_) {
    for (const DeviceTensor& p : l.params) out.push_back(p.to_host());
  }
  return out;
}

std::vector<std::string> Model::names() const {
  std::vector<std::string> out;
  for (const Layer& l : layers_) out.insert(out.end(), l.names.begin(), l.names.end());
  return out;
}

std::vector<Shape> Model::shapes() const {
  std::vector<Shape> out;
  for (const Layer& l : layers_) out.insert(out.end(), l.shapes.begin(), l.shapes.end());
  return out;
}

std::size_t Model::layers() const { return layers_.size(); }

std::vector<DeviceTensor>& Model::layer_parameters(std::size_t k) {
  MESHTEST_CHECK(k < layers_.size(), "gpu dp::Model: layer {} of {}", k, layers_.size());
  return layers_[k].params;
}

const std::vector<DeviceTensor>& Model::layer_parameters(std::size_t k) const {
  MESHTEST_CHECK(k < layers_.size(), "gpu dp::Model: layer {} of {}", k, layers_.size());
  return layers_[k].params;
}

void Model::sgd_step(const std::vector<DeviceTensor>& grads, double lr) {
  std::size_t k = 0;
  for (Layer& l : layers_) {
    for (DeviceTensor& p : l.params) {
      MESHTEST_CHECK(
          k < grads.size() && grads[k].shape() == p.shape() && grads[k].dtype() == p.dtype(),
          "gpu dp::Model::sgd_step: gradient {} does not match parameter {}", k, describe(p));
      MESHTEST_CUDA_CHECK(detail::launch_axpy(f64_of(p), p.bytes(), grads[k].bytes(), -lr,
                                              p.numel(), blas_->stream()));
      ++k;
    }
  }
  MESHTEST_CHECK(k == grads.size(), "gpu dp::Model::sgd_step: {} gradients for {} parameters",
                 grads.size(), k);
  blas_->synchronize();
}

Shape Model::check(const DeviceTensor& x, const DeviceTensor& y, std::string_view mode_name,
                   const md::DpOptions& opt) const {
  constexpr std::string_view op = "gpu DP step";
  (void)md::find_mode(mode_name);  // an Error naming the registered ones
  md::check_clip(opt.clip, "gpu DP step");
  MESHTEST_CHECK(x.rank() == 2 || x.rank() == 3, "{}: inputs are {}, expected [B, d] or [B, T, d]",
                 op, describe(x));
  MESHTEST_CHECK(x.dtype() == dtype_, "{}: inputs are {} but the model is {}", op, x.dtype(),
                 dtype_);
  check_on_device(op, "x", x, blas_->device());
  check_on_device(op, "y", y, blas_->device());
  // The features through the layers, then the loss's targets (shape, dtype and classes).
  Shape out = x.shape();
  for (const Layer& l : layers_) {
    const std::int64_t d = out[out.rank() - 1];
    if (l.kind == Kind::linear) {
      MESHTEST_CHECK(d == l.shapes[0][1], "{}: {}'s input has {} features, expected {}", op,
                     l.names[0], d, l.shapes[0][1]);
      out = out.with(out.rank() - 1, l.shapes[0][0]);
    } else if (l.kind == Kind::rmsnorm) {
      MESHTEST_CHECK(d == l.shapes[0].numel(), "{}: {}'s input has {} features, expected {}", op,
                     l.names[0], d, l.shapes[0].numel());
    }
  }
  if (opt.loss == md::LossKind::mse) {
    MESHTEST_CHECK(y.shape() == out && y.dtype() == dtype_,
                   "{}: mse targets are {}, expected {}{} (the output's shape)", op, describe(y),
                   dtype_, out);
  } else {
    const std::int64_t batch = x.shape()[0];
    const Shape want = out.rank() == 2 ? Shape{batch} : Shape{batch, out[1]};
    MESHTEST_CHECK(y.shape() == want && (y.dtype() == DType::i64 || y.dtype() == DType::i32),
                   "{}: ce targets are {}, expected i64 or i32 classes of shape {}", op,
                   describe(y), want);
    const Tensor classes = y.to_host();
    const std::int64_t feat = out[out.rank() - 1];
    for (std::int64_t r = 0; r < classes.numel(); ++r) {
      const std::int64_t k = classes.dtype() == DType::i64 ? classes.data<std::int64_t>()[r]
                                                           : classes.data<std::int32_t>()[r];
      MESHTEST_CHECK(k >= 0 && k < feat, "{}: target {} at row {} is outside [0, {})", op, k, r,
                     feat);
    }
  }
  return out;
}

Grads Model::compute(const DeviceTensor& x, const DeviceTensor& y, std::string_view mode_name,
                     const md::DpOptions& opt, const md::StepHooks& hooks) {
  constexpr std::string_view op = "gpu DP step";
  (void)check(x, y, mode_name, opt);
  const md::Mode& mode = md::find_mode(mode_name);
  Blas& blas = *blas_;
  const DeviceGuard guard(blas.device());
  const bool f64 = dtype_ == DType::f64;
  const std::int64_t batch = x.shape()[0];
  const auto before = [&](std::size_t k) {
    if (hooks.layers.before) hooks.layers.before(k);
  };
  const auto after = [&](std::size_t k) {
    if (hooks.layers.after) hooks.layers.after(k);
  };

  // Forward, caching every layer's input.
  DeviceTensor h = queued_copy(blas, x);
  for (std::size_t k = 0; k < layers_.size(); ++k) {
    Layer& l = layers_[k];
    before(k);
    l.input_shape = h.shape();
    l.input = std::move(h);
    switch (l.kind) {
      case Kind::linear:
        h = linear_forward(blas, l, l.input);
        break;
      case Kind::rmsnorm:
        h = rms_norm_forward(blas, l, l.input);
        break;
      default:
        h = activation(blas, l, l.input);
        break;
    }
    after(k);
  }
  // The loss (its targets checked by check()).
  const auto [rows, feat] = rows_features(h.shape());
  const std::int64_t seq = batch == 0 ? 1 : rows / batch;
  const std::int64_t divisor = opt.global_batch >= 0 ? opt.global_batch : batch;
  const double loss_scale = opt.reduction == md::Reduction::mean
                                ? 1.0 / static_cast<double>(std::max<std::int64_t>(divisor, 1))
                                : 1.0;
  DeviceTensor grad = queued(blas, h.shape(), h.dtype());
  DeviceTensor row_loss = queued(blas, Shape{rows}, h.dtype());
  if (opt.loss == md::LossKind::mse) {
    MESHTEST_CUDA_CHECK(detail::launch_mse_rows(f64, h.bytes(), y.bytes(), rows, feat, loss_scale,
                                                grad.bytes(), row_loss.bytes(), blas.stream()));
  } else {
    MESHTEST_CUDA_CHECK(detail::launch_ce_rows(f64, h.bytes(), y.bytes(), y.dtype() == DType::i64,
                                               rows, feat, loss_scale, grad.bytes(),
                                               row_loss.bytes(), blas.stream()));
  }
  Grads r;
  {
    const DeviceTensor sums = group_sums(blas, row_loss, batch, seq, 1);
    blas.synchronize();  // the per-sample losses read on the host
    const Tensor per_sample = sums.to_host();
    double total = 0;
    for (std::int64_t i = 0; i < batch; ++i) {
      total += f64 ? per_sample.data<double>()[i] : per_sample.data<float>()[i];
    }
    r.loss = total * loss_scale;
  }
  const double norm_scale = opt.reduction == md::Reduction::mean
                                ? static_cast<double>(std::max<std::int64_t>(divisor, 1))
                                : 1.0;

  const auto backward = [&](const DeviceTensor& g_out, Ctx& ctx) {
    DeviceTensor g = queued_copy(blas, g_out);
    for (std::size_t k = layers_.size(); k-- > 0;) {
      Layer& l = layers_[k];
      before(k);
      ctx.input_grad = k > 0;
      switch (l.kind) {
        case Kind::linear:
          g = linear_backward(blas, l, g, ctx);
          break;
        case Kind::rmsnorm:
          g = rms_norm_backward(blas, l, g, ctx);
          break;
        default:
          g = activation_backward(blas, l, g, ctx);
          break;
      }
      after(k);
    }
  };
  const auto norm_ctx = [&] {
    Ctx c{.grads = false, .norms = true, .fused = mode.fused_layers, .norm_scale = norm_scale};
    c.norm_sq = queued_zeros(blas, Shape{batch}, dtype_);
    return c;
  };
  const auto finish_norms = [&](const Ctx& ctx) {
    blas.synchronize();  // the squared norms read on the host
    r.norms = md::norms_from_squares(ctx.norm_sq->to_host());
    r.coef = md::clip_coefficients(r.norms, opt.clip);
  };
  const std::string& name = mode.name;
  if (name == "non_private") {
    Ctx ctx{.grads = true};
    backward(grad, ctx);
  } else if (name == "hooks" || name == "fused_bk") {
    Ctx ctx = norm_ctx();
    ctx.per_sample = name == "hooks";
    ctx.keep = !ctx.per_sample;
    backward(grad, ctx);
    finish_norms(ctx);
    const DeviceTensor coef = DeviceTensor::from_host(r.coef);
    for (Layer& l : layers_) {
      bookkeeping_grads(blas, l, coef);
      release(l);
    }
  } else if (name == "ghost" || name == "fused") {
    Ctx ctx = norm_ctx();
    ctx.grads_if_free = name == "fused";
    backward(grad, ctx);
    finish_norms(ctx);
    bool none_clipped = true;
    for (std::int64_t i = 0; i < batch; ++i) {
      none_clipped =
          none_clipped && (f64 ? r.coef.data<double>()[i] == 1.0 : r.coef.data<float>()[i] == 1.0f);
    }
    bool done = ctx.grads_if_free && ctx.all_grads && none_clipped;
    if (hooks.all_of) done = hooks.all_of(done);  // a second pass on every device or on none
    if (!done) {
      Ctx second{.grads = true, .fused = mode.fused_layers};
      backward(scale_samples(blas, grad, DeviceTensor::from_host(r.coef)), second);
    }
  } else {
    MESHTEST_CHECK(false, "{}: mode '{}' has no GPU form", op, name);
  }
  for (Layer& l : layers_) {
    for (std::size_t p = 0; p < l.params.size(); ++p) {
      r.grads.push_back(l.grads[p] ? std::move(*l.grads[p])
                                   : queued_zeros(blas, l.shapes[p], dtype_));
      l.grads[p].reset();
    }
    release(l);
  }
  blas.synchronize();  // complete when it returns
  return r;
}

}  // namespace meshtest::gpu::dp
