// moe (GPU): checks, outputs and perf scopes around the kernels of moe_kernel.cu.
#include "src/gpu/moe.hpp"

#include <algorithm>
#include <span>
#include <string_view>
#include <vector>

#include "src/gpu/index_flag.hpp"
#include "src/gpu/moe_kernel.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {
namespace {

using detail::kNoIndex;
using detail::RouterFloat;

/// The kernels' type of a router tensor, or an Error naming op and the tensor ("logits are").
RouterFloat router_float(std::string_view op, std::string_view what, const DeviceTensor& t) {
  switch (t.dtype()) {
    case DType::f32:
      return RouterFloat::f32;
    case DType::f64:
      return RouterFloat::f64;
    case DType::bf16:
      return RouterFloat::bf16;
    default:
      throw Error(fmt::format("{}: {} {}: f32, f64 or bf16 expected", op, what, describe(t)));
  }
}

void check_logits(std::string_view op, const DeviceTensor& logits) {
  MESHTEST_CHECK(logits.rank() == 2, "{}: logits are {}, expected [T, experts]", op,
                 describe(logits));
  (void)router_float(op, "logits are", logits);
}

/// Throws "<op>: logit of token t, expert e is NaN" when the flag holds an index.
void throw_if_nan(std::string_view op, const IndexFlag& nan_at, std::int64_t experts) {
  const unsigned long long i = nan_at.read();
  if (i == kNoIndex) return;
  const auto flat = static_cast<std::int64_t>(i);
  throw Error(
      fmt::format("{}: logit of token {}, expert {} is NaN", op, flat / experts, flat % experts));
}

/// Counts the slots of r per expert into counts (u64 [E], zeroed) and throws the CPU's Error for
/// an expert id outside [0, E) (synchronizing the stream).
void count_experts(std::string_view op, const DeviceRouting& r, std::int64_t num_experts,
                   DeviceTensor& counts, cudaStream_t stream) {
  MESHTEST_CHECK(num_experts >= 1, "{}: {} experts, expected at least 1", op, num_experts);
  MESHTEST_CHECK(r.experts.dtype() == DType::i64 && r.experts.numel() == r.num_tokens * r.k,
                 "{}: the routing's experts are {}, expected i64 [{}, {}]", op, describe(r.experts),
                 r.num_tokens, r.k);
  IndexFlag bad_at(stream);
  const auto* chosen = reinterpret_cast<const std::int64_t*>(r.experts.bytes());
  MESHTEST_CUDA_CHECK(detail::launch_expert_counts(
      chosen, r.experts.numel(), num_experts, reinterpret_cast<unsigned long long*>(counts.bytes()),
      bad_at.get(), stream));
  const unsigned long long bad = bad_at.read();
  if (bad == kNoIndex) return;
  const auto s = static_cast<std::int64_t>(bad);
  std::int64_t e = 0;
  MESHTEST_CUDA_CHECK(cudaMemcpy(&e, chosen + s, sizeof e, cudaMemcpyDeviceToHost));
  throw Error(fmt::format("{}: token {} (slot {}) is routed to expert {}, expected [0, {})", op,
                          s / r.k, s % r.k, e, num_experts));
}

/// make_permutation's work, its errors named by `op`.
DevicePermutation group_slots(std::string_view op, const DeviceRouting& r, std::int64_t num_experts,
                              cudaStream_t stream);

std::vector<std::int64_t> host_i64(const DeviceTensor& t) {
  const Tensor h = t.to_host();
  const std::span<const std::int64_t> v = h.span<std::int64_t>();
  return {v.begin(), v.end()};
}

}  // namespace

Routing DeviceRouting::to_host() const {
  return {
      .num_tokens = num_tokens, .k = k, .experts = host_i64(experts), .weights = weights.to_host()};
}

DeviceRouting gate(const DeviceTensor& logits, std::int64_t k, cudaStream_t stream,
                   const GatingOptions& o) {
  constexpr std::string_view op = "gpu gate";
  check_logits(op, logits);
  const std::int64_t tokens = logits.shape()[0];
  const std::int64_t experts = logits.shape()[1];
  MESHTEST_CHECK(k >= 1 && k <= experts, "{}: k is {}, expected 1 .. {} (the number of experts)",
                 op, k, experts);
  const DeviceGuard guard(logits.empty() ? current_device() : logits.device());
  DeviceRouting r{
      .num_tokens = tokens,
      .k = k,
      .experts = DeviceTensor(Shape{tokens, k}, DType::i64, Tensor::Uninitialized{}),
      .weights = DeviceTensor(Shape{tokens, k}, logits.dtype(), Tensor::Uninitialized{})};
  IndexFlag nan_at(stream);
  perf::OpScope scope("gate");
  const bool softmax_first = o.order == GatingOrder::SoftmaxThenTopK;
  scope.input(info(logits))
      .attr("k", k)
      .attr("order", softmax_first ? "softmax_topk" : "topk_softmax");
  time_on_stream(scope, stream);
  MESHTEST_CUDA_CHECK(detail::launch_gate(router_float(op, "logits are", logits), logits.bytes(),
                                          tokens, experts, k, softmax_first, o.renormalize,
                                          reinterpret_cast<std::int64_t*>(r.experts.bytes()),
                                          r.weights.bytes(), nan_at.get(), stream));
  scope.output(info(r.weights)).flops(static_cast<double>(logits.numel()));
  throw_if_nan(op, nan_at, experts);
  return r;
}

DeviceTensor router_probabilities(const DeviceTensor& logits, cudaStream_t stream) {
  constexpr std::string_view op = "gpu router_probabilities";
  check_logits(op, logits);
  const DeviceGuard guard(logits.empty() ? current_device() : logits.device());
  DeviceTensor p(logits.shape(), logits.dtype() == DType::f64 ? DType::f64 : DType::f32,
                 Tensor::Uninitialized{});
  IndexFlag nan_at(stream);
  perf::OpScope scope("router_probabilities");
  scope.input(info(logits));
  time_on_stream(scope, stream);
  MESHTEST_CUDA_CHECK(detail::launch_router_probabilities(
      router_float(op, "logits are", logits), logits.bytes(), logits.shape()[0], logits.shape()[1],
      p.bytes(), nan_at.get(), stream));
  scope.output(info(p)).flops(3.0 * static_cast<double>(logits.numel()));
  throw_if_nan(op, nan_at, logits.shape()[1]);
  return p;
}

DeviceTensor expert_load(const DeviceRouting& r, std::int64_t num_experts, cudaStream_t stream) {
  DeviceTensor counts(Shape{std::max<std::int64_t>(num_experts, 0)}, DType::i64);
  count_experts("gpu expert_load", r, num_experts, counts, stream);
  return counts;  // u64 counts below 2^63 are their i64
}

double load_balancing_loss(const DeviceTensor& probs, const DeviceRouting& r, cudaStream_t stream) {
  constexpr std::string_view op = "gpu load_balancing_loss";
  MESHTEST_CHECK(probs.rank() == 2 && probs.shape()[0] == r.num_tokens &&
                     (probs.dtype() == DType::f32 || probs.dtype() == DType::f64),
                 "{}: probs are {}, expected f32 or f64 [{}, E]", op, describe(probs),
                 r.num_tokens);
  const std::int64_t experts = probs.shape()[1];
  const std::vector<std::int64_t> counts = host_i64(expert_load(r, experts, stream));
  if (r.num_tokens == 0) return 0.0;
  DeviceTensor means(Shape{experts}, DType::f64, Tensor::Uninitialized{});
  MESHTEST_CUDA_CHECK(
      detail::launch_column_means(probs.dtype() == DType::f64, probs.bytes(), r.num_tokens, experts,
                                  reinterpret_cast<double*>(means.bytes()), stream));
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Tensor mean_p = means.to_host();
  const double slots = static_cast<double>(r.num_tokens * r.k);
  double sum = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    sum += static_cast<double>(counts[e]) / slots * mean_p.item(e);
  }
  return static_cast<double>(experts) * sum;
}

Permutation DevicePermutation::to_host() const {
  Permutation p{.num_tokens = num_tokens,
                .k = k,
                .num_experts = num_experts,
                .slots = host_i64(slots),
                .offsets = host_i64(offsets),
                .dropped = {}};
  const std::vector<std::int64_t> rows = host_i64(row_of_slot);
  for (std::size_t s = 0; s < rows.size(); ++s) {
    if (rows[s] < 0) p.dropped.push_back(static_cast<std::int64_t>(s));
  }
  return p;
}

DevicePermutation make_permutation(const DeviceRouting& r, std::int64_t num_experts,
                                   cudaStream_t stream) {
  return group_slots("gpu make_permutation", r, num_experts, stream);
}

namespace {

DevicePermutation group_slots(std::string_view op, const DeviceRouting& r, std::int64_t num_experts,
                              cudaStream_t stream) {
  const DeviceGuard guard(r.experts.empty() ? current_device() : r.experts.device());
  DeviceTensor counts(Shape{std::max<std::int64_t>(num_experts, 0)}, DType::i64);
  perf::OpScope scope("make_permutation");
  scope.attr("tokens", r.num_tokens).attr("k", r.k).attr("experts", num_experts);
  time_on_stream(scope, stream);
  count_experts(op, r, num_experts, counts, stream);
  const std::int64_t n = r.num_tokens * r.k;
  DevicePermutation p{
      .num_tokens = r.num_tokens,
      .k = r.k,
      .num_experts = num_experts,
      .slots = DeviceTensor(Shape{n}, DType::i64, Tensor::Uninitialized{}),
      .offsets = DeviceTensor(Shape{num_experts + 1}, DType::i64, Tensor::Uninitialized{}),
      .row_of_slot = DeviceTensor(Shape{n}, DType::i64, Tensor::Uninitialized{})};
  MESHTEST_CUDA_CHECK(detail::launch_permutation(
      reinterpret_cast<const std::int64_t*>(r.experts.bytes()), n, num_experts,
      reinterpret_cast<const unsigned long long*>(counts.bytes()),
      reinterpret_cast<std::int64_t*>(p.offsets.bytes()),
      reinterpret_cast<std::int64_t*>(p.slots.bytes()),
      reinterpret_cast<std::int64_t*>(p.row_of_slot.bytes()), stream));
  return p;
}

}  // namespace

DevicePermutation permute_top1(const DeviceTensor& expert_of, std::int64_t num_experts,
                               cudaStream_t stream) {
  MESHTEST_CHECK(expert_of.rank() == 1 && expert_of.dtype() == DType::i64,
                 "gpu permute_top1: expert_of is {}, expected i64 [T]", describe(expert_of));
  const std::int64_t tokens = expert_of.shape()[0];
  DeviceRouting r{.num_tokens = tokens, .k = 1, .experts = {}, .weights = {}};
  r.experts = expert_of.reshape(Shape{tokens, 1});
  return group_slots("gpu permute_top1", r, num_experts, stream);
}

DevicePermutation to_device(const Permutation& p) {
  std::vector<std::int64_t> row_of_slot(static_cast<std::size_t>(p.num_tokens * p.k), -1);
  for (std::size_t i = 0; i < p.slots.size(); ++i) {
    row_of_slot[static_cast<std::size_t>(p.slots[i])] = static_cast<std::int64_t>(i);
  }
  const auto upload = [](const std::vector<std::int64_t>& v) {
    return DeviceTensor::from_host(
        Tensor::from_vector(Shape{static_cast<std::int64_t>(v.size())}, v));
  };
  return {.num_tokens = p.num_tokens,
          .k = p.k,
          .num_experts = p.num_experts,
          .slots = upload(p.slots),
          .offsets = upload(p.offsets),
          .row_of_slot = upload(row_of_slot)};
}

std::int64_t apply_capacity(DevicePermutation& p, std::int64_t capacity, cudaStream_t stream,
                            DropPolicy policy, const DeviceTensor* weights) {
  constexpr std::string_view op = "gpu apply_capacity";
  MESHTEST_CHECK(capacity >= 0, "{}: capacity is {}, expected >= 0", op, capacity);
  const bool lowest = policy == DropPolicy::LowestWeight;
  RouterFloat t = RouterFloat::f32;
  const DeviceGuard guard(p.slots.empty() ? current_device() : p.slots.device());
  if (lowest) {
    MESHTEST_CHECK(weights != nullptr && weights->shape() == (Shape{p.num_tokens, p.k}),
                   "{}: DropPolicy::LowestWeight needs the routing weights [{}, {}]{}", op,
                   p.num_tokens, p.k,
                   weights != nullptr ? fmt::format(", not {}", describe(*weights)) : "");
    t = router_float(op, "the weights are", *weights);
    IndexFlag nan_at(stream);
    MESHTEST_CUDA_CHECK(
        detail::launch_find_nan(t, weights->bytes(), weights->numel(), nan_at.get(), stream));
    if (const unsigned long long i = nan_at.read(); i != kNoIndex) {
      const auto s = static_cast<std::int64_t>(i);
      throw Error(fmt::format("{}: weight of token {}, slot {} is NaN", op, s / p.k, s % p.k));
    }
  }
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));  // p's offsets, for the new ones
  const std::vector<std::int64_t> old_offsets = host_i64(p.offsets);
  std::vector<std::int64_t> offsets{0};
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    offsets.push_back(offsets.back() + std::min(old_offsets[e + 1] - old_offsets[e], capacity));
  }
  const std::int64_t rows = p.rows(), kept = offsets.back();
  perf::OpScope scope("apply_capacity");
  scope.attr("capacity", capacity).attr("rows", rows);
  DeviceTensor keep(Shape{rows}, DType::u8, Tensor::Uninitialized{});
  Tensor offsets_host(Shape{p.num_experts + 1}, DType::i64);
  std::copy(offsets.begin(), offsets.end(), offsets_host.data<std::int64_t>());
  DeviceTensor new_offsets = DeviceTensor::from_host(offsets_host);
  DeviceTensor new_slots(Shape{kept}, DType::i64, Tensor::Uninitialized{});
  const auto* slots = reinterpret_cast<const std::int64_t*>(p.slots.bytes());
  const auto* old = reinterpret_cast<const std::int64_t*>(p.offsets.bytes());
  auto* keep_flags = reinterpret_cast<std::uint8_t*>(keep.bytes());
  time_on_stream(scope, stream);
  MESHTEST_CUDA_CHECK(detail::launch_capacity_keep(slots, old, p.num_experts, rows, capacity,
                                                   lowest, t, lowest ? weights->bytes() : nullptr,
                                                   keep_flags, stream));
  MESHTEST_CUDA_CHECK(detail::launch_capacity_compact(
      slots, old, p.num_experts, rows, keep_flags,
      reinterpret_cast<const std::int64_t*>(new_offsets.bytes()),
      reinterpret_cast<std::int64_t*>(new_slots.bytes()),
      reinterpret_cast<std::int64_t*>(p.row_of_slot.bytes()), stream));
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the old slots are freed
  p.slots = std::move(new_slots);
  p.offsets = std::move(new_offsets);
  return rows - kept;
}

DeviceTensor permute(const DeviceTensor& x, const DevicePermutation& p, cudaStream_t stream) {
  constexpr std::string_view op = "gpu permute";
  MESHTEST_CHECK(x.rank() == 2 && x.shape()[0] == p.num_tokens,
                 "{}: x is {} but the permutation is for {} tokens ([T, hidden] expected)", op,
                 describe(x), p.num_tokens);
  const DeviceGuard guard(x.empty() ? current_device() : x.device());
  const std::int64_t h = x.shape()[1];
  DeviceTensor out(Shape{p.rows(), h}, x.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("permute");
  scope.input(info(x)).attr("k", p.k);
  time_on_stream(scope, stream);
  const auto element = static_cast<int>(dtype_size(x.dtype()));
  MESHTEST_CUDA_CHECK(
      detail::launch_gather_rows(x.bytes(), reinterpret_cast<const std::int64_t*>(p.slots.bytes()),
                                 p.rows(), p.k, h * element, element, out.bytes(), stream));
  scope.output(info(out));
  return out;
}

DeviceTensor unpermute(const DeviceTensor& y, const DevicePermutation& p,
                       const DeviceTensor& weights, cudaStream_t stream) {
  constexpr std::string_view op = "gpu unpermute";
  MESHTEST_CHECK(y.rank() == 2 && y.shape()[0] == p.rows(),
                 "{}: y is {}, expected [{}, hidden] (the permutation's rows)", op, describe(y),
                 p.rows());
  MESHTEST_CHECK(weights.shape() == (Shape{p.num_tokens, p.k}) && weights.dtype() == y.dtype(),
                 "{}: weights are {}, expected {}[{}, {}] (y's dtype)", op, describe(weights),
                 y.dtype(), p.num_tokens, p.k);
  const RouterFloat t = router_float(op, "y is", y);
  const DeviceGuard guard(y.empty() ? current_device() : y.device());
  const std::int64_t h = y.shape()[1];
  DeviceTensor out(Shape{p.num_tokens, h}, y.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("unpermute");
  scope.input(info(y)).input(info(weights)).attr("k", p.k);
  time_on_stream(scope, stream);
  MESHTEST_CUDA_CHECK(detail::launch_unpermute(
      t, y.bytes(), reinterpret_cast<const std::int64_t*>(p.row_of_slot.bytes()), weights.bytes(),
      p.num_tokens, p.k, h, out.bytes(), stream));
  scope.output(info(out)).flops(2.0 * static_cast<double>(p.num_tokens * p.k * h));
  return out;
}

}  // namespace meshtest::gpu
