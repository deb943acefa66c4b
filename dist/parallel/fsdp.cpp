// FsdpDpSgd: gather per layer, mode backward(s), reduce_scatter, shard noise and update.
#include "dist/parallel/fsdp.hpp"

#include "dist/ccl/all_gather.hpp"
#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/reduce_scatter.hpp"
#include "dist/mesh/agree.hpp"
#include "src/dp/real.hpp"

namespace meshtest::dist {

FsdpDpSgd::FsdpDpSgd(const MeshDevice& mesh, const dp::Sequential& model, dp::DpSgdOptions opt,
                     int axis)
    : mesh_(&mesh),
      axis_(axis),
      opt_(std::move(opt)),
      pm_(model, opt_.mode, opt_.dp),
      optimizer_(opt_.optimizer) {
  dp::check_noise(opt_.noise, "FsdpDpSgd");
  const int n = mesh.axis_size(axis), r = mesh.axis_index(axis);
  for (dp::Param* p : pm_.model().parameters()) {
    const std::int64_t numel = p->shape.numel();
    shards_.push_back(p->value.reshape({numel}).slice(0, split_range(numel, n, r)));
    p->value = Tensor();
  }
}

void FsdpDpSgd::gather_layer(std::size_t layer) {
  std::size_t first = 0;
  for (std::size_t i = 0; i < layer; ++i) first += pm_.model().layer(i).params().size();
  for (dp::Param& p : pm_.model().layer(layer).params()) {
    p.value = all_gather(*mesh_, shards_[first++], {.dim = 0, .axis = axis_}).reshape(p.shape);
  }
}

void FsdpDpSgd::free_layer(std::size_t layer) {
  for (dp::Param& p : pm_.model().layer(layer).params()) p.value = Tensor();
}

FsdpDpSgd::NoisyGrads FsdpDpSgd::noisy_grads(const Tensor& x, const Tensor& y) {
  check_and_agree(mesh_->comm(axis_), "FSDP DP-SGD step",
                  [&] { dp::check_batch(pm_.model(), x, y, opt_.dp); });
  Tensor b = Tensor::from_vector<std::int64_t>({1}, {x.shape()[0]});
  all_reduce_inplace(*mesh_, b, {.axis = axis_});
  NoisyGrads out{.global_batch = b.data<std::int64_t>()[0]};

  dp::DpOptions dpo = opt_.dp;
  dpo.global_batch = out.global_batch;
  const dp::StepHooks hooks{.layers = {.before = [this](std::size_t l) { gather_layer(l); },
                                       .after = [this](std::size_t l) { free_layer(l); }},
                            .all_of = [this](bool v) { return all_ranks(mesh_->comm(axis_), v); }};
  dp::DpGrads g = pm_.mode().run(pm_.model(), x, y, dpo, hooks);
  pm_.model().release();

  const int n = mesh_->axis_size(axis_), r = mesh_->axis_index(axis_);
  const double divisor = dp::noise_divisor(opt_.dp.reduction, out.global_batch);
  for (std::size_t p = 0; p < shards_.size(); ++p) {
    const std::int64_t numel = g.grads[p].numel();
    Tensor shard_grad =
        reduce_scatter(*mesh_, g.grads[p].reshape({numel}), {.dim = 0, .axis = axis_});
    dp::add_noise(shard_grad, split_range(numel, n, r).start, static_cast<std::int64_t>(p),
                  optimizer_.step(), opt_.noise, opt_.dp.clip, divisor);
    out.shard_grads.push_back(std::move(shard_grad));
  }
  out.report = {.norms = std::move(g.norms), .coef = std::move(g.coef), .loss = g.loss};
  return out;
}

dp::StepReport FsdpDpSgd::step(const Tensor& x, const Tensor& y) {
  NoisyGrads g = noisy_grads(x, y);
  optimizer_.next_step();
  for (std::size_t p = 0; p < shards_.size(); ++p)
    optimizer_.update(p, shards_[p], g.shard_grads[p]);
  return std::move(g.report);
}

std::vector<Tensor> FsdpDpSgd::gather_parameters() const {
  std::vector<Tensor> out;
  const auto params = pm_.model().parameters();
  for (std::size_t p = 0; p < shards_.size(); ++p) {
    out.push_back(
        all_gather(*mesh_, shards_[p], {.dim = 0, .axis = axis_}).reshape(params[p]->shape));
  }
  return out;
}

}  // namespace meshtest::dist
