// expert_parallel_grad: the backward of the expert-parallel routed experts and combine, through
// the forward's exchanges (rows with their grad_out and routing weight out, grads back).
#include <string_view>

#include "dist/ccl/all_reduce.hpp"
#include "dist/ccl/all_to_all.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/ep_routes.hpp"
#include "dist/parallel/expert_parallel.hpp"
#include "src/ops/grouped_gemm.hpp"
#include "src/ops/swiglu_grad.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

// The grad at the experts' outputs and of the routing weights, per kept row:
// g = w · grad_out (the combine's weight) and gw = grad_out · y (y with the mlp2 bias).
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
  const int tp_axis = ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    MESHTEST_DIST_CHECK(t.rank() == 2, "{}: t has shape {}, expected [T_local, hidden]", op,
                        t.shape());
    MESHTEST_DIST_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
                        "{}: dtype {} is not supported (expected f32 or f64)", op, t.dtype());
    ep_detail::check_ep_weights(op, mesh, w, p, o, t.shape()[1], t.dtype());
    ep_detail::check_ep_tokens(op, t, r, w.placement.num_experts, p);
    MESHTEST_DIST_CHECK(grad_out.shape() == t.shape() && grad_out.dtype() == t.dtype(),
                        "{}: grad_out is {}, expected {}[{}] (as t)", op, describe(grad_out),
                        t.dtype(), t.shape());
  });
  const std::int64_t hidden = t.shape()[1];
  const ep_detail::Routes routes = ep_detail::plan_routes(mesh, r, w, p, o);
  // Out: each slot's token row, its grad_out row and its routing weight, side by side.
  const Tensor sent = concat({permute(t, routes.send), permute(grad_out, routes.send),
                              ep_detail::gather_slots(r.weights, routes.send)},
                             1);
  const Tensor kept =
      permute(all_to_all_v(mesh, sent, routes.send_counts, {.axis = o.ep_axis}), routes.recv);
  const Tensor x = kept.slice(1, 0, hidden);
  const ep_detail::ExpertActivations acts = ep_detail::local_experts(mesh, x, routes.recv, w, p, o);
  const OutputGrads out =
      output_grads(kept.slice(1, hidden, hidden), kept.slice(1, 2 * hidden, 1), acts.y);
  MoeGrads grads;
  Tensor grad_x;
  if (kept.shape()[0] == 0) {  // no rows here: zero weight grads, and an empty TP sum
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
  // The grad of x is a partial sum over the intermediate units of each TP device.
  if (mesh.axis_size(tp_axis) > 1) all_reduce_inplace(mesh, grad_x, {.axis = tp_axis});
  // Back: each row's grad of x and of its routing weight (zeros for a dropped row).
  const Tensor back =
      all_to_all_v(mesh, ep_detail::to_receive_order(concat({grad_x, out.gw}, 1), routes.recv),
                   routes.recv_counts, {.axis = o.ep_axis});
  Tensor ones(r.weights.shape(), t.dtype());
  ones.fill(1.0);
  grads.t = unpermute(back.slice(1, 0, hidden), routes.send, ones);
  grads.weights = ep_detail::scatter_slots(back.slice(1, hidden, 1), routes.send);
  scope.input(t).input(grad_out).output(grads.t).attr("k", r.k);
  return grads;
}

}  // namespace meshtest::dist
