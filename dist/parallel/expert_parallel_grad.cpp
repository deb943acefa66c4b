// expert_parallel_grad: the backward of the expert-parallel routed experts and combine, through
// the forward's routes (the side lists, each token's row and grad_out row once per device out,
// one row of grads back).
#include <string_view>

#include "dist/ccl/all_to_all.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/ep_routes.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "src/ops/moe/grouped_gemm.hpp"
#include "src/ops/swiglu_grad.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

// The grad at the experts' outputs and of the routing weights, per kept pair:
// g = w · grad_out (the combine's weight) and gw = grad_out · y (y this TP device's part of the
// expert output, with the mlp2 bias on TP device 0: gw is a TP partial, linear in y).
//   grad_out, y: [n, hidden], w: [n, 1]  ->  {g [n, hidden], gw [n, 1]}
struct OutputGrads {
  Tensor g;
  Tensor gw;
};

template <class T>
OutputGrads output_grads_impl(const Tensor& grad_out, const Tensor& w, const Tensor& y) {
  OutputGrads out{.g = Tensor(grad_out.shape(), grad_out.dtype()),
                  .gw = Tensor(w.shape(), w.dtype())};
  if (grad_out.numel() == 0) return out;
  const auto go = grad_out.matrix<T>();
  out.g.matrix<T>().noalias() = w.vector<T>().asDiagonal() * go;
  out.gw.vector<T>() = go.cwiseProduct(y.matrix<T>()).rowwise().sum();
  return out;
}

OutputGrads output_grads(const Tensor& grad_out, const Tensor& w, const Tensor& y) {
  if (grad_out.dtype() == DType::f64) return output_grads_impl<double>(grad_out, w, y);
  return output_grads_impl<float>(grad_out, w, y);
}

}  // namespace

MoeGrads ep_moe_backward(const MeshDevice& mesh, const Tensor& t, const Routing& r,
                         const EpMlpWeights& w, const Tensor& grad_out, const MoeParams& p,
                         const EpOptions& o) {
  constexpr std::string_view op = "ep_moe_backward";
  perf::OpScope scope(op);
  ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    MESHTEST_DIST_CHECK(t.rank() == 2, "{}: t has shape {}, expected [T_local, hidden]", op,
                        t.shape());
    MESHTEST_DIST_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                        "{}: dtype {} is not supported (expected f32 or f64)", op, t.dtype());
    ep_detail::check_ep_weights(op, mesh, w, p, o, t.shape()[1], t.dtype());
    ep_detail::check_ep_tokens(op, t.shape()[0], t.dtype(), r, w.placement.num_experts, p);
    MESHTEST_DIST_CHECK(grad_out.shape() == t.shape() && grad_out.dtype() == t.dtype(),
                        "{}: grad_out is {}, expected {}[{}] (as t)", op, describe(grad_out),
                        t.dtype(), t.shape());
  });
  const std::int64_t hidden = t.shape()[1], k = r.k;
  const ep_detail::Routes routes = ep_detail::plan_routes(mesh, r, w.placement, w.device, p, o);
  // Out: each row's token and its grad_out side by side, once per device.
  const Tensor sent = concat({permute(t, routes.send), permute(grad_out, routes.send)}, 1);
  const Tensor rows = all_to_all_v(mesh, sent, routes.send_counts, {.axis = o.ep_axis});
  const Tensor kept = permute(rows, routes.recv);  // per kept pair
  const Tensor x = kept.slice(1, 0, hidden);
  const ep_detail::ExpertActivations acts = ep_detail::local_experts(mesh, x, routes.recv, w, p, o);
  const OutputGrads out =
      output_grads(kept.slice(1, hidden, hidden),
                   ep_detail::gather_slots(routes.recv_weights, routes.recv), acts.y);
  MoeGrads grads;
  Tensor grad_x;
  if (kept.shape()[0] == 0) {  // no pairs here: zero weight grads
    grads.mlp2_weight = Tensor(w.mlp.mlp2_weight.shape(), t.dtype());
    grads.mlp2_bias = Tensor(w.mlp.mlp2_bias.shape(), t.dtype());
    grads.mlp1_weight = Tensor(w.mlp.mlp1_weight.shape(), t.dtype());
    grads.mlp1_bias = Tensor(w.mlp.mlp1_bias.shape(), t.dtype());
    grad_x = Tensor(Shape{0, hidden}, t.dtype());
  } else {
    GroupedGemmGrads g2 =
        grouped_gemm_backward(acts.a, routes.recv.offsets, w.mlp.mlp2_weight, out.g);
    const Tensor grad_h = swiglu_backward(acts.h, g2.x, p.swiglu_alpha, p.swiglu_limit);
    GroupedGemmGrads g1 = grouped_gemm_backward(x, routes.recv.offsets, w.mlp.mlp1_weight, grad_h);
    grads.mlp2_weight = std::move(g2.w);
    grads.mlp2_bias = std::move(g2.bias);
    grads.mlp1_weight = std::move(g1.w);
    grads.mlp1_bias = std::move(g1.bias);
    grad_x = std::move(g1.x);
  }
  // Per received row: the grad of x summed over its pairs and its k weight grads (zeros past
  // its pairs and for a dropped pair), both partial sums over the TP devices' units.
  const std::int64_t received = routes.recv.num_tokens;
  Tensor row_grads =
      concat({unpermute(grad_x, routes.recv, ep_detail::ones(Shape{received, k}, t.dtype())),
              ep_detail::scatter_values(out.gw, routes.recv.slots, Shape{received, k})},
             1);
  ep_detail::sum_over_tp(mesh, row_grads, o);
  const Tensor back = all_to_all_v(mesh, row_grads, routes.recv_counts, {.axis = o.ep_axis});
  grads.t = unpermute(back.slice(1, 0, hidden), routes.send,
                      ep_detail::ones(Shape{r.num_tokens, routes.send.k}, t.dtype()));
  grads.weights =
      ep_detail::scatter_values(back.slice(1, hidden, k), routes.send_pairs, r.weights.shape());
  scope.input(t).input(grad_out).output(grads.t).attr("k", r.k);
  return grads;
}

}  // namespace meshtest::dist
