// ep_moe (GPU): the checks, the routes planned on the host (ep_routes), the rows and GEMMs on the
// GPU, and the exchanges on device tensors, forward (ep_moe, ep_mlp_block) and backward.
#include "dist/gpu/parallel/ep_moe.hpp"

#include <array>
#include <span>
#include <string_view>
#include <utility>

#include "dist/mesh/agree.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "dist/parallel/ep_routes.hpp"
#include "src/gpu/linear.hpp"
#include "src/gpu/moe.hpp"
#include "src/gpu/reduce.hpp"
#include "src/gpu/rms_norm.hpp"
#include "src/gpu/swiglu.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::dist {
namespace {

namespace g = meshtest::gpu;

// A host tensor of ones, on the current GPU (unpermute's unit weights).
DeviceTensor ones(Shape shape, DType dtype) {
  return DeviceTensor::from_host(ep_detail::ones(std::move(shape), dtype));
}

// [a | b] along dim 1; a and b complete (the caller synchronized their stream).
DeviceTensor concat_columns(const DeviceTensor& a, const DeviceTensor& b) {
  DeviceTensor out(Shape{a.shape()[0], a.shape()[1] + b.shape()[1]}, a.dtype(),
                   Tensor::Uninitialized{});
  if (out.empty()) return out;
  out.assign_slice(1, 0, a);
  out.assign_slice(1, a.shape()[1], b);
  return out;
}

void check_tensor(std::string_view op, std::string_view name, const DeviceTensor& x,
                  const Shape& want, DType dtype, int device) {
  MESHTEST_DIST_CHECK(x.shape() == want && x.dtype() == dtype, "{}: {} is {}, expected {}{}", op,
                      name, g::describe(x), dtype, want);
  g::check_on_device(op, name, x, device);
}

// The checks of the host op (ep_routes' layout and routing checks) on this rank's tensors.
void check_inputs(std::string_view op, const MeshDevice& mesh, const g::Blas& blas,
                  const DeviceTensor& t, const GpuEpMlpWeights& w, const MoeParams& p,
                  const EpOptions& o) {
  MESHTEST_DIST_CHECK(t.rank() == 2 && (t.dtype() == DType::f32 || t.dtype() == DType::bf16),
                      "{}: the tokens are {}, expected f32 or bf16 [T_local, hidden]", op,
                      g::describe(t));
  g::check_on_device(op, "the tokens", t, blas.device());
  ep_detail::check_ep_layout(op, mesh, w.placement, w.device, p, o);
  const std::int64_t hidden = t.shape()[1], experts = w.placement.num_experts;
  const auto local =
      static_cast<std::int64_t>(w.placement.experts_of[static_cast<std::size_t>(w.device)].size());
  MESHTEST_DIST_CHECK(w.mlp2_weight.rank() == 3, "{}: mlp2_weight is {}, expected [{}, {}, I/tp]",
                      op, g::describe(w.mlp2_weight), local, hidden);
  const std::int64_t inter = w.mlp2_weight.shape()[2];
  const DType dt = t.dtype();
  const int dev = blas.device();
  MESHTEST_DIST_CHECK(
      w.norm_scale.shape() == Shape{hidden} &&
          (w.norm_scale.dtype() == DType::f32 || w.norm_scale.dtype() == DType::bf16),
      "{}: norm.scale is {}, expected f32 or bf16 [{}]", op, g::describe(w.norm_scale), hidden);
  g::check_on_device(op, "norm.scale", w.norm_scale, dev);
  check_tensor(op, "gate.weight", w.gate_weight, Shape{experts, hidden}, dt, dev);
  check_tensor(op, "gate.bias", w.gate_bias, Shape{experts}, dt, dev);
  check_tensor(op, "mlp1_weight", w.mlp1_weight, Shape{local, 2 * inter, hidden}, dt, dev);
  check_tensor(op, "mlp1_bias", w.mlp1_bias, Shape{local, 2 * inter}, dt, dev);
  check_tensor(op, "mlp2_weight", w.mlp2_weight, Shape{local, hidden, inter}, dt, dev);
  check_tensor(op, "mlp2_bias", w.mlp2_bias, Shape{local, hidden}, dt, dev);
}

// The receiver's experts on its kept pairs x [n, hidden] grouped by `offsets`, this TP device's
// units: y = W2 swiglu(W1 x + b1) (+ b2 on TP device 0, so that the bias joins the TP sum once).
DeviceTensor local_experts(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& x,
                           std::span<const std::int64_t> offsets, const GpuEpMlpWeights& w,
                           const MoeParams& p, const EpOptions& o) {
  if (x.shape()[0] == 0) return DeviceTensor(Shape{0, x.shape()[1]}, x.dtype());
  const DeviceTensor h = g::grouped_gemm(blas, x, offsets, w.mlp1_weight, &w.mlp1_bias);
  const DeviceTensor a = g::swiglu(h, blas.stream(), p.swiglu_alpha, p.swiglu_limit);
  const bool adds_bias = mesh.axis_index(ep_tp_axis(o)) == 0;
  return g::grouped_gemm(blas, a, offsets, w.mlp2_weight, adds_bias ? &w.mlp2_bias : nullptr);
}

// all_reduce over the TP axis (1 − ep_axis) of a complete x; nothing on a TP axis of one.
void sum_over_tp(const MeshDevice& mesh, DeviceTensor& x, const EpOptions& o) {
  const int tp_axis = ep_tp_axis(o);
  if (mesh.axis_size(tp_axis) > 1) all_reduce_inplace(mesh, x, {.axis = tp_axis});
}

// The routed experts on checked inputs.
GpuEpMoeResult moe_unchecked(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& t,
                             const Routing& r, const GpuEpMlpWeights& w, const MoeParams& p,
                             const EpOptions& o) {
  cudaStream_t stream = blas.stream();
  const ep_detail::Routes routes = ep_detail::plan_routes(mesh, r, w.placement, w.device, p, o);
  const g::DevicePermutation send = g::to_device(routes.send);
  const g::DevicePermutation recv = g::to_device(routes.recv);
  const DeviceTensor out_rows = g::permute(t, send, stream);
  blas.synchronize();  // the CCL reads complete tensors
  const DeviceTensor rows = all_to_all_v(mesh, out_rows, routes.send_counts, {.axis = o.ep_axis});
  // Every tensor the stream reads stays alive until it is synchronized.
  const DeviceTensor pairs = g::permute(rows, recv, stream);
  const DeviceTensor y = local_experts(mesh, blas, pairs, routes.recv.offsets, w, p, o);
  // One row per received token: its pairs weighted and summed (a dropped pair adds nothing),
  // then summed over TP (linear in y, so the TP partials may be summed after the weights).
  const DeviceTensor pair_weights = DeviceTensor::from_host(routes.recv_weights);
  DeviceTensor combined = g::unpermute(y, recv, pair_weights, stream);
  blas.synchronize();
  sum_over_tp(mesh, combined, o);
  const DeviceTensor back = all_to_all_v(mesh, combined, routes.recv_counts, {.axis = o.ep_axis});
  const DeviceTensor unit = ones(Shape{r.num_tokens, send.k}, t.dtype());
  GpuEpMoeResult result{.out = g::unpermute(back, send, unit, stream),
                        .dropped = routes.dropped,
                        .rows_sent = routes.send_counts,
                        .rows_received = routes.recv_counts};
  blas.synchronize();
  return result;
}

}  // namespace

GpuEpMlpWeights to_gpu(const EpMlpWeights& w) {
  const MlpWeights& m = w.mlp;
  const auto up = [](const Tensor& x) { return DeviceTensor::from_host(x); };
  return {.placement = w.placement,
          .device = w.device,
          .norm_scale = up(m.norm_scale),
          .gate_weight = up(m.gate_weight),
          .gate_bias = up(m.gate_bias),
          .mlp1_weight = up(m.mlp1_weight),
          .mlp1_bias = up(m.mlp1_bias),
          .mlp2_weight = up(m.mlp2_weight),
          .mlp2_bias = up(m.mlp2_bias)};
}

GpuEpMoeResult ep_moe(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& t,
                      const Routing& r, const GpuEpMlpWeights& w, const MoeParams& p,
                      const EpOptions& o) {
  constexpr std::string_view op = "gpu ep_moe";
  perf::OpScope scope(op);
  ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    check_inputs(op, mesh, blas, t, w, p, o);
    ep_detail::check_ep_tokens(op, t.shape()[0], t.dtype(), r, w.placement.num_experts, p);
  });
  scope.input(g::info(t)).attr("k", r.k);
  GpuEpMoeResult result = moe_unchecked(mesh, blas, t, r, w, p, o);
  scope.output(g::info(result.out));
  return result;
}

DeviceTensor ep_mlp_block(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& x,
                          const GpuEpMlpWeights& w, const MoeParams& p, const EpOptions& o) {
  constexpr std::string_view op = "gpu ep_mlp_block";
  perf::OpScope scope(op);
  ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] { check_inputs(op, mesh, blas, x, w, p, o); });
  scope.input(g::info(x));
  cudaStream_t stream = blas.stream();
  const DeviceTensor t = g::rms_norm(x, w.norm_scale, stream, p.norm_eps);
  const g::DeviceRouting routing =
      g::gate(g::linear(blas, t, w.gate_weight, w.gate_bias), p.experts_per_token, stream);
  blas.synchronize();
  const DeviceTensor moe = moe_unchecked(mesh, blas, t, routing.to_host(), w, p, o).out;
  DeviceTensor out(x.shape(), x.dtype(), Tensor::Uninitialized{});
  const std::array<const std::byte*, 2> terms{x.bytes(), moe.bytes()};
  if (!out.empty())
    g::reduce_terms(out.bytes(), terms, x.numel(), x.dtype(), g::Reduce::sum, stream);
  blas.synchronize();
  scope.output(g::info(out));
  return out;
}

g::DeviceMoeGrads ep_moe_backward(const MeshDevice& mesh, g::Blas& blas, const DeviceTensor& t,
                                  const Routing& r, const GpuEpMlpWeights& w,
                                  const DeviceTensor& grad_out, const MoeParams& p,
                                  const EpOptions& o) {
  constexpr std::string_view op = "gpu ep_moe_backward";
  perf::OpScope scope(op);
  ep_tp_axis(o);
  check_and_agree(mesh.comm(), op, [&] {
    check_inputs(op, mesh, blas, t, w, p, o);
    MESHTEST_DIST_CHECK(t.dtype() == DType::f32, "{}: dtype {} is not supported (expected f32)", op,
                        t.dtype());
    ep_detail::check_ep_tokens(op, t.shape()[0], t.dtype(), r, w.placement.num_experts, p);
    MESHTEST_DIST_CHECK(grad_out.shape() == t.shape() && grad_out.dtype() == t.dtype(),
                        "{}: grad_out is {}, expected {}[{}] (as t)", op, g::describe(grad_out),
                        t.dtype(), t.shape());
    g::check_on_device(op, "grad_out", grad_out, blas.device());
  });
  scope.input(g::info(t)).input(g::info(grad_out)).attr("k", r.k);
  cudaStream_t stream = blas.stream();
  const std::int64_t hidden = t.shape()[1], k = r.k;
  const ep_detail::Routes routes = ep_detail::plan_routes(mesh, r, w.placement, w.device, p, o);
  const g::DevicePermutation send = g::to_device(routes.send);
  const g::DevicePermutation recv = g::to_device(routes.recv);
  // Out: each row's token and its grad_out side by side, once per device.
  const DeviceTensor t_rows = g::permute(t, send, stream);
  const DeviceTensor g_rows = g::permute(grad_out, send, stream);
  blas.synchronize();
  const DeviceTensor rows =
      all_to_all_v(mesh, concat_columns(t_rows, g_rows), routes.send_counts, {.axis = o.ep_axis});
  const DeviceTensor kept = g::permute(rows, recv, stream);  // per kept pair
  blas.synchronize();
  const std::int64_t received = routes.recv.num_tokens;
  g::DeviceMoeGrads grads;
  DeviceTensor grad_x, grad_w;
  if (kept.shape()[0] == 0) {  // no pairs here: zero weight grads
    grads.mlp1_weight = DeviceTensor(w.mlp1_weight.shape(), DType::f32);
    grads.mlp1_bias = DeviceTensor(w.mlp1_bias.shape(), DType::f32);
    grads.mlp2_weight = DeviceTensor(w.mlp2_weight.shape(), DType::f32);
    grads.mlp2_bias = DeviceTensor(w.mlp2_bias.shape(), DType::f32);
    grad_x = DeviceTensor(Shape{0, hidden}, DType::f32);
    grad_w = DeviceTensor(Shape{received, k}, DType::f32);
  } else {
    const bool adds_bias = mesh.axis_index(ep_tp_axis(o)) == 0;
    const DeviceTensor x = kept.slice(1, 0, hidden), g_pairs = kept.slice(1, hidden, hidden);
    const DeviceTensor pair_weights = DeviceTensor::from_host(routes.recv_weights);
    g::DeviceMoeGrads e = g::grouped_experts_backward(
        blas, x, g_pairs, recv, routes.recv.offsets, pair_weights, w.mlp1_weight, w.mlp1_bias,
        w.mlp2_weight, adds_bias ? &w.mlp2_bias : nullptr, p);
    blas.synchronize();  // before x, g_pairs and pair_weights are freed
    grads.mlp1_weight = std::move(e.mlp1_weight);
    grads.mlp1_bias = std::move(e.mlp1_bias);
    grads.mlp2_weight = std::move(e.mlp2_weight);
    grads.mlp2_bias = std::move(e.mlp2_bias);
    grad_x = std::move(e.t);
    grad_w = std::move(e.weights);
  }
  // Per received row: the grad of x summed over its pairs and its k weight grads (zeros past its
  // pairs and for a dropped pair), both partial sums over the TP devices' units.
  const DeviceTensor unit_pairs = ones(Shape{received, k}, DType::f32);
  const DeviceTensor row_x = g::unpermute(grad_x, recv, unit_pairs, stream);
  blas.synchronize();
  DeviceTensor row_grads = concat_columns(row_x, grad_w);
  sum_over_tp(mesh, row_grads, o);
  const DeviceTensor back = all_to_all_v(mesh, row_grads, routes.recv_counts, {.axis = o.ep_axis});
  const DeviceTensor back_x = back.slice(1, 0, hidden);
  const DeviceTensor unit_rows = ones(Shape{r.num_tokens, send.k}, DType::f32);
  grads.t = g::unpermute(back_x, send, unit_rows, stream);
  // The weight grads to their slots: T·k values, placed on the host.
  const Tensor back_w = back.slice(1, hidden, k).to_host();
  grads.weights = DeviceTensor::from_host(
      ep_detail::scatter_values(back_w, routes.send_pairs, r.weights.shape()));
  blas.synchronize();
  scope.output(g::info(grads.t));
  return grads;
}

}  // namespace meshtest::dist
