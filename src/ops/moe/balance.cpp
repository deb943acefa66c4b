// moe/balance: the auxiliary loss from the routing's slot counts and the mean probabilities, and
// expert placements (array_split blocks, greedy longest-processing-time) with their checks.
#include "src/ops/moe/balance.hpp"

#include <algorithm>
#include <numeric>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

// A placement of E experts on D devices with the views built from device_of.
ExpertPlacement from_devices(std::vector<int> device_of, int num_devices) {
  ExpertPlacement p{
      .num_experts = static_cast<std::int64_t>(device_of.size()),
      .num_devices = num_devices,
      .device_of = std::move(device_of),
      .experts_of = std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(num_devices))};
  for (std::int64_t e = 0; e < p.num_experts; ++e) p.experts_of[p.device_of[e]].push_back(e);
  return p;
}

}  // namespace

std::int64_t ExpertPlacement::local_index(std::int64_t e) const {
  MESHTEST_CHECK(e >= 0 && e < num_experts && e < static_cast<std::int64_t>(device_of.size()),
                 "ExpertPlacement::local_index: expert {} is outside [0, {})", e, num_experts);
  const int d = device_of[e];
  MESHTEST_CHECK(d >= 0 && d < static_cast<int>(experts_of.size()),
                 "ExpertPlacement::local_index: expert {} is on device {}, outside [0, {})", e, d,
                 experts_of.size());
  const auto& local = experts_of[d];
  const auto it = std::find(local.begin(), local.end(), e);
  MESHTEST_CHECK(it != local.end(),
                 "ExpertPlacement::local_index: expert {} is not among device {}'s experts", e, d);
  return it - local.begin();
}

std::vector<std::int64_t> expert_load(const Routing& r, std::int64_t num_experts) {
  MESHTEST_CHECK(num_experts >= 1, "expert_load: num_experts is {}, expected >= 1", num_experts);
  MESHTEST_CHECK(r.num_tokens >= 0 && r.k >= 1 &&
                     static_cast<std::int64_t>(r.experts.size()) == r.num_tokens * r.k,
                 "expert_load: routing is for {} tokens x k {} but lists {} experts", r.num_tokens,
                 r.k, r.experts.size());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(num_experts), 0);
  for (std::size_t s = 0; s < r.experts.size(); ++s) {
    const std::int64_t e = r.experts[s];
    MESHTEST_CHECK(e >= 0 && e < num_experts,
                   "expert_load: token {} (slot {}) is routed to expert {}, expected [0, {})",
                   static_cast<std::int64_t>(s) / r.k, static_cast<std::int64_t>(s) % r.k, e,
                   num_experts);
    ++counts[e];
  }
  return counts;
}

double load_balancing_loss(const Tensor& probs, const Routing& r) {
  constexpr std::string_view op = "load_balancing_loss";
  perf::OpScope scope(op);
  scope.input(probs).attr("k", r.k);
  detail::check_rank(op, "probs ([T, E])", probs, 2);
  MESHTEST_CHECK(is_floating(probs.dtype()), "{}: probs have dtype {}, expected f32, f64 or bf16",
                 op, probs.dtype());
  const std::int64_t experts = probs.shape()[1];
  detail::check_shape(op, "probs", probs, Shape{r.num_tokens, experts});
  const std::vector<std::int64_t> counts = expert_load(r, experts);
  if (r.num_tokens == 0) return 0.0;
  const Tensor p = probs.astype(DType::f64);
  const Eigen::VectorXd mean_p = p.matrix<double>().colwise().mean().transpose();
  const double slots = static_cast<double>(r.num_tokens * r.k);
  double sum = 0;
  for (std::int64_t e = 0; e < experts; ++e)
    sum += static_cast<double>(counts[e]) / slots * mean_p(e);
  scope.flops(static_cast<double>(probs.numel()));
  return static_cast<double>(experts) * sum;
}

ExpertPlacement contiguous_placement(std::int64_t num_experts, int num_devices) {
  MESHTEST_CHECK(num_experts >= 1 && num_devices >= 1,
                 "contiguous_placement: {} experts on {} devices, expected at least 1 of each",
                 num_experts, num_devices);
  std::vector<int> device_of(static_cast<std::size_t>(num_experts));
  for (int d = 0; d < num_devices; ++d) {
    const Range r = split_range(num_experts, num_devices, d);
    std::fill_n(device_of.begin() + r.start, r.size, d);
  }
  return from_devices(std::move(device_of), num_devices);
}

ExpertPlacement balanced_placement(std::span<const std::int64_t> load, int num_devices) {
  MESHTEST_CHECK(!load.empty(), "balanced_placement: the load lists no experts");
  MESHTEST_CHECK(num_devices >= 1, "balanced_placement: {} devices, expected at least 1",
                 num_devices);
  const auto experts = static_cast<std::int64_t>(load.size());
  for (std::int64_t e = 0; e < experts; ++e) {
    MESHTEST_CHECK(load[e] >= 0, "balanced_placement: expert {} has load {}, expected >= 0", e,
                   load[e]);
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return load[a] > load[b]; });
  std::vector<std::int64_t> dev_load(static_cast<std::size_t>(num_devices), 0);
  std::vector<std::int64_t> dev_count(static_cast<std::size_t>(num_devices), 0);
  std::vector<int> device_of(static_cast<std::size_t>(experts));
  for (const std::int64_t e : order) {
    int best = 0;
    for (int d = 1; d < num_devices; ++d) {
      if (dev_load[d] < dev_load[best] ||
          (dev_load[d] == dev_load[best] && dev_count[d] < dev_count[best])) {
        best = d;
      }
    }
    device_of[e] = best;
    dev_load[best] += load[e];
    ++dev_count[best];
  }
  return from_devices(std::move(device_of), num_devices);
}

void check_placement(const ExpertPlacement& p) {
  constexpr std::string_view op = "check_placement";
  MESHTEST_CHECK(p.num_experts >= 1 && p.num_devices >= 1,
                 "{}: {} experts on {} devices, expected at least 1 of each", op, p.num_experts,
                 p.num_devices);
  MESHTEST_CHECK(static_cast<std::int64_t>(p.device_of.size()) == p.num_experts &&
                     static_cast<int>(p.experts_of.size()) == p.num_devices,
                 "{}: device_of lists {} experts and experts_of {} devices, expected {} and {}", op,
                 p.device_of.size(), p.experts_of.size(), p.num_experts, p.num_devices);
  std::vector<int> placed_on(static_cast<std::size_t>(p.num_experts), -1);
  for (int d = 0; d < p.num_devices; ++d) {
    for (const std::int64_t e : p.experts_of[d]) {
      MESHTEST_CHECK(e >= 0 && e < p.num_experts, "{}: device {} holds expert {}, outside [0, {})",
                     op, d, e, p.num_experts);
      MESHTEST_CHECK(placed_on[e] < 0, "{}: expert {} is placed twice (devices {} and {})", op, e,
                     placed_on[e], d);
      placed_on[e] = d;
    }
  }
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    MESHTEST_CHECK(placed_on[e] >= 0, "{}: expert {} is on no device", op, e);
    MESHTEST_CHECK(p.device_of[e] == placed_on[e],
                   "{}: device_of says expert {} is on device {}, experts_of says device {}", op, e,
                   p.device_of[e], placed_on[e]);
  }
}

std::vector<std::int64_t> device_load(const ExpertPlacement& p,
                                      std::span<const std::int64_t> load) {
  check_placement(p);
  MESHTEST_CHECK(static_cast<std::int64_t>(load.size()) == p.num_experts,
                 "device_load: the load lists {} experts, the placement {}", load.size(),
                 p.num_experts);
  std::vector<std::int64_t> out(static_cast<std::size_t>(p.num_devices), 0);
  for (std::int64_t e = 0; e < p.num_experts; ++e) out[p.device_of[e]] += load[e];
  return out;
}

}  // namespace meshtest
