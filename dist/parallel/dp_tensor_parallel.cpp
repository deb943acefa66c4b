// Column-parallel DP norms: local partial squared norms, one all_reduce of B values.
#include "dist/parallel/dp_tensor_parallel.hpp"

#include "dist/ccl/all_reduce.hpp"
#include "dist/mesh/agree.hpp"
#include "src/dp/clip.hpp"
#include "src/dp/norms.hpp"
#include "src/ops/visit_real.hpp"

namespace meshtest::dist {

ColumnParallelModel split_last_linear(const MeshDevice& mesh, const dp::Sequential& model,
                                      int axis) {
  MESHTEST_CHECK(model.size() > 0 && model.layer(model.size() - 1).kind() == "linear",
                 "split_last_linear: the model's last layer must be a plain Linear");
  ColumnParallelModel out;
  for (std::size_t i = 0; i + 1 < model.size(); ++i) out.prefix.add(model.layer(i).clone());
  const auto& last = static_cast<const dp::Linear&>(model.layer(model.size() - 1));
  const Range rows =
      split_range(last.params()[0].shape[0], mesh.axis_size(axis), mesh.axis_index(axis));
  const Tensor w = last.params()[0].value.slice(0, rows);
  const Tensor b = last.has_bias() ? last.params()[1].value.slice(0, rows) : Tensor();
  const int index = static_cast<int>(model.size() - 1);
  out.head.add(std::make_unique<dp::FusedLinear>(dp::Linear(w, b, index)));
  dp::replace_linear_with_fused(out.prefix);
  return out;
}

TpDpGrads tp_clipped_grads(const MeshDevice& mesh, ColumnParallelModel& model, const Tensor& x,
                           const Tensor& y, const dp::DpOptions& opt, int axis) {
  check_and_agree(mesh.comm(axis), "tensor-parallel DP step", [&] {
    MESHTEST_CHECK(opt.loss == dp::LossKind::mse,
                   "tensor-parallel DP supports the mse loss only (it splits over features)");
    dp::check_clip(opt.clip, "tensor-parallel DP step");
    MESHTEST_CHECK(x.rank() == 2 || x.rank() == 3, "inputs have shape {}, expected [B, (T,) d]",
                   x.shape());
    const std::int64_t mid = model.prefix.out_features(x.shape()[x.rank() - 1]);
    MESHTEST_CHECK(x.dtype() == model.head.dtype(), "inputs are {} but the model is {}", x.dtype(),
                   model.head.dtype());
    dp::check_batch(model.head, Tensor(x.shape().with(x.rank() - 1, mid), x.dtype()), y, opt);
  });
  const std::int64_t batch = x.shape()[0];
  const Tensor h = model.prefix.size() > 0 ? model.prefix.forward(x) : x;
  const Tensor out = model.head.forward(h);
  const dp::LossOutput loss = dp::loss_and_grad(out, y, opt.loss, opt.reduction);
  const double scale = opt.reduction == dp::Reduction::mean
                           ? static_cast<double>(std::max<std::int64_t>(batch, 1))
                           : 1;

  // The head: its local rows' norms and the partial input grad.
  dp::BackwardContext head{.input_grad = model.prefix.size() > 0,
                           .grads = false,
                           .norms = true,
                           .keep = true,
                           .norm_scale = scale,
                           .norm_sq = Tensor(Shape{batch}, x.dtype())};
  Tensor gh = model.head.layer(0).backward(loss.grad, head);
  // The prefix: replicated, so its norms are added on axis index 0 only.
  dp::BackwardContext prefix{.grads = false,
                             .norms = true,
                             .keep = true,
                             .norm_scale = scale,
                             .norm_sq = Tensor(Shape{batch}, x.dtype())};
  if (model.prefix.size() > 0) {
    all_reduce_inplace(mesh, gh, {.axis = axis});  // Partial -> Replicate
    model.prefix.backward(gh, prefix);
  }
  Tensor sq = head.norm_sq;
  if (mesh.axis_index(axis) == 0 && model.prefix.size() > 0) {
    visit_real(sq.dtype(), "tp norms",
               [&]<class S>(type_tag<S>) { sq.vector<S>() += prefix.norm_sq.vector<S>(); });
  }
  all_reduce_inplace(mesh, sq, {.axis = axis});  // the one all_reduce of B values
  TpDpGrads r;
  r.norms = dp::norms_from_squares(sq);
  r.coef = dp::clip_coefficients(r.norms, opt.clip);
  for (auto* seq : {&model.prefix, &model.head}) {
    for (std::size_t i = 0; i < seq->size(); ++i) seq->layer(i).bookkeeping_grads(r.coef);
  }
  for (dp::Param* p : model.prefix.parameters()) r.prefix_grads.push_back(std::move(p->grad));
  for (dp::Param* p : model.head.parameters()) r.head_grads.push_back(std::move(p->grad));
  model.prefix.release();
  model.head.release();
  return r;
}

}  // namespace meshtest::dist
