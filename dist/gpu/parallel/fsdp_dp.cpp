// GpuFsdpDpSgd: the GPU model's passes with each layer gathered around them, then per parameter a
// reduce_scatter, the shard's noise (on the host) and the optimizer's update.
#include "dist/gpu/parallel/fsdp_dp.hpp"

#include "dist/ccl/all_reduce.hpp"
#include "dist/gpu/ccl/ccl.hpp"
#include "dist/mesh/agree.hpp"
#include "src/dp/clip.hpp"
#include "src/dp/modes.hpp"
#include "src/dp/noise.hpp"
#include "src/gpu/dp_model_kernel.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist {

namespace g = meshtest::gpu;

namespace {

/// `model`, once the options' checks have passed (the CPU FsdpDpSgd's: the mode, the clip, the
/// noise), before the model is copied to the GPU.
const dp::Sequential& checked(const dp::Sequential& model, const dp::DpSgdOptions& opt) {
  dp::check_noise(opt.noise, "GpuFsdpDpSgd");
  (void)dp::find_mode(opt.mode);
  dp::check_clip(opt.dp.clip, "GpuFsdpDpSgd");
  return model;
}

}  // namespace

GpuFsdpDpSgd::GpuFsdpDpSgd(const MeshDevice& mesh, g::Blas& blas, const dp::Sequential& model,
                           dp::DpSgdOptions opt, int axis)
    : mesh_(&mesh),
      blas_(&blas),
      axis_(axis),
      opt_(std::move(opt)),
      model_(blas, checked(model, opt_)),
      optimizer_(opt_.optimizer),
      shapes_(model_.shapes()) {
  const int n = mesh.axis_size(axis), r = mesh.axis_index(axis);
  const g::DeviceGuard guard(blas.device());
  for (std::size_t k = 0; k < model_.layers(); ++k) {
    first_.push_back(shards_.size());
    for (g::DeviceTensor& p : model_.layer_parameters(k)) {
      const std::int64_t numel = p.numel();
      shards_.push_back(p.reshape({numel}).slice(0, split_range(numel, n, r)));
      p = g::DeviceTensor();
    }
  }
  first_.push_back(shards_.size());
}

GpuFsdpDpSgd::~GpuFsdpDpSgd() = default;

bool GpuFsdpDpSgd::gathered(std::size_t layer) const {
  const std::vector<g::DeviceTensor>& params = model_.layer_parameters(layer);
  return !params.empty() && !params.front().empty();
}

void GpuFsdpDpSgd::gather_layer(std::size_t layer) {
  std::vector<g::DeviceTensor>& params = model_.layer_parameters(layer);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t p = first_[layer] + i;
    params[i] = all_gather(*mesh_, shards_[p], {.dim = 0, .axis = axis_}).reshape(shapes_[p]);
  }
}

void GpuFsdpDpSgd::free_layer(std::size_t layer) {
  for (g::DeviceTensor& p : model_.layer_parameters(layer)) p = g::DeviceTensor();
}

dp::StepReport GpuFsdpDpSgd::step(const g::DeviceTensor& x, const g::DeviceTensor& y) {
  check_and_agree(mesh_->comm(axis_), "GPU FSDP DP-SGD step",
                  [&] { (void)model_.check(x, y, opt_.mode, opt_.dp); });
  Tensor b = Tensor::from_vector<std::int64_t>({1}, {x.shape()[0]});
  all_reduce_inplace(*mesh_, b, {.axis = axis_});
  const std::int64_t global_batch = b.data<std::int64_t>()[0];

  dp::DpOptions dpo = opt_.dp;
  dpo.global_batch = global_batch;
  const dp::StepHooks hooks{.layers = {.before = [this](std::size_t l) { gather_layer(l); },
                                       .after = [this](std::size_t l) { free_layer(l); }},
                            .all_of = [this](bool v) { return all_ranks(mesh_->comm(axis_), v); }};
  g::dp::Grads grads = model_.compute(x, y, opt_.mode, dpo, hooks);

  const int n = mesh_->axis_size(axis_), r = mesh_->axis_index(axis_);
  const double divisor = dp::noise_divisor(opt_.dp.reduction, global_batch);
  const g::DeviceGuard guard(blas_->device());
  const std::int64_t step = optimizer_.step();  // the noise's key (FsdpDpSgd's)
  optimizer_.next_step();
  for (std::size_t p = 0; p < shards_.size(); ++p) {
    const std::int64_t numel = shapes_[p].numel();
    g::DeviceTensor shard_grad =
        reduce_scatter(*mesh_, grads.grads[p].reshape({numel}), {.dim = 0, .axis = axis_});
    grads.grads[p] = g::DeviceTensor();
    const bool sgd = opt_.optimizer.kind == dp::OptimizerKind::sgd;
    if (opt_.noise.sigma == 0 && sgd) {
      MESHTEST_CUDA_CHECK(g::detail::launch_axpy(
          shard_grad.dtype() == DType::f64, shards_[p].bytes(), shard_grad.bytes(),
          -opt_.optimizer.lr, shard_grad.numel(), blas_->stream()));
      continue;
    }
    Tensor host_grad = shard_grad.to_host();
    dp::add_noise(host_grad, split_range(numel, n, r).start, static_cast<std::int64_t>(p), step,
                  opt_.noise, opt_.dp.clip, divisor);
    if (sgd) {
      const g::DeviceTensor noisy = g::DeviceTensor::from_host(host_grad);
      MESHTEST_CUDA_CHECK(g::detail::launch_axpy(noisy.dtype() == DType::f64, shards_[p].bytes(),
                                                 noisy.bytes(), -opt_.optimizer.lr, noisy.numel(),
                                                 blas_->stream()));
      blas_->synchronize();  // before `noisy` is freed
    } else {
      Tensor value = shards_[p].to_host();
      optimizer_.update(p, value, host_grad);
      shards_[p] = g::DeviceTensor::from_host(value);
    }
  }
  blas_->synchronize();
  return {.norms = std::move(grads.norms), .coef = std::move(grads.coef), .loss = grads.loss};
}

std::vector<Tensor> GpuFsdpDpSgd::gather_parameters() const {
  std::vector<Tensor> out;
  for (std::size_t p = 0; p < shards_.size(); ++p) {
    out.push_back(
        all_gather(*mesh_, shards_[p], {.dim = 0, .axis = axis_}).reshape(shapes_[p]).to_host());
  }
  return out;
}

}  // namespace meshtest::dist
