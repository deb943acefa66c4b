// DpSgd: the single-device DP-SGD step.
#include "src/dp/dp_sgd.hpp"

namespace meshtest::dp {

double noise_divisor(Reduction r, std::int64_t global_batch) {
  return r == Reduction::mean ? static_cast<double>(std::max<std::int64_t>(global_batch, 1)) : 1.0;
}

void add_step_noise(std::vector<Tensor>& grads, std::int64_t step, const DpSgdOptions& opt,
                    std::int64_t global_batch) {
  const double div = noise_divisor(opt.dp.reduction, global_batch);
  for (std::size_t p = 0; p < grads.size(); ++p) {
    add_noise(grads[p], 0, static_cast<std::int64_t>(p), step, opt.noise, opt.dp.clip, div);
  }
}

DpSgd::DpSgd(Sequential model, DpSgdOptions opt)
    : opt_(std::move(opt)), pm_(std::move(model), opt_.mode, opt_.dp), opt_state_(opt_.optimizer) {
  check_noise(opt_.noise, "DpSgd");
}

StepReport DpSgd::step(const Tensor& x, const Tensor& y) {
  DpGrads g = pm_.compute(x, y);
  const std::int64_t batch = opt_.dp.global_batch >= 0 ? opt_.dp.global_batch : x.shape()[0];
  add_step_noise(g.grads, opt_state_.step(), opt_, batch);
  opt_state_.next_step();
  std::vector<Param*> params = pm_.model().parameters();
  for (std::size_t p = 0; p < params.size(); ++p)
    opt_state_.update(p, params[p]->value, g.grads[p]);
  return {.norms = std::move(g.norms), .coef = std::move(g.coef), .loss = g.loss};
}

}  // namespace meshtest::dp
