// moe/permute: counting-sort grouping of routed slots by expert, capacity drops, the gather
// (permute) and the weighted scatter back (unpermute).
#include "src/ops/moe/permute.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {
namespace {

using detail::compute_t;
using detail::ComputeMatrix;

// Groups the slots s = t*k + j of `experts` ([T*k]) by expert with a counting sort, so the
// slots of an expert stay ascending.
Permutation group_by_expert(std::string_view op, std::span<const std::int64_t> experts,
                            std::int64_t k, std::int64_t num_experts) {
  MESHTEST_CHECK(num_experts >= 0, "{}: num_experts is {}, expected >= 0", op, num_experts);
  const auto n = static_cast<std::int64_t>(experts.size());
  Permutation p{.num_tokens = n / k,
                .k = k,
                .num_experts = num_experts,
                .slots = {},
                .offsets = std::vector<std::int64_t>(static_cast<std::size_t>(num_experts + 1)),
                .dropped = {}};
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t e = experts[s];
    MESHTEST_CHECK(e >= 0 && e < num_experts,
                   "{}: token {} (slot {}) is routed to expert {}, expected [0, {})", op, s / k,
                   s % k, e, num_experts);
    ++p.offsets[e + 1];
  }
  std::partial_sum(p.offsets.begin(), p.offsets.end(), p.offsets.begin());
  std::vector<std::int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
  p.slots.resize(static_cast<std::size_t>(n));
  for (std::int64_t s = 0; s < n; ++s) p.slots[next[experts[s]]++] = s;
  return p;
}

// The routing weights [T, k] as doubles, NaN rejected (LowestWeight sorts by them).
std::vector<double> weights_of(const Permutation& p, const Tensor* weights) {
  MESHTEST_CHECK(weights != nullptr && !detail::is_unset(*weights),
                 "apply_capacity: DropPolicy::LowestWeight needs the routing weights [{}, {}]",
                 p.num_tokens, p.k);
  detail::check_shape("apply_capacity", "weights", *weights, Shape{p.num_tokens, p.k});
  MESHTEST_CHECK(is_floating(weights->dtype()),
                 "apply_capacity: weights have dtype {}, expected f32, f64 or bf16",
                 weights->dtype());
  std::vector<double> w(static_cast<std::size_t>(weights->numel()));
  for (std::int64_t s = 0; s < weights->numel(); ++s) {
    w[s] = weights->item(s);
    MESHTEST_CHECK(!std::isnan(w[s]), "apply_capacity: weight of token {}, slot {} is NaN", s / p.k,
                   s % p.k);
  }
  return w;
}

template <class S>
Tensor unpermute_impl(const Tensor& y, const Permutation& p, const Tensor& weights) {
  using C = compute_t<S>;
  const std::int64_t h = y.shape()[1];
  // row_of[slot]: the row of y holding the slot, -1 when dropped.
  std::vector<std::int64_t> row_of(static_cast<std::size_t>(p.num_tokens * p.k), -1);
  for (std::int64_t i = 0; i < p.rows(); ++i) row_of[p.slots[i]] = i;
  const ComputeMatrix<S> ym(y, 0, p.rows(), h);
  const ComputeMatrix<S> wm(weights, 0, p.num_tokens, p.k);
  RowMatrix<C> out = RowMatrix<C>::Zero(p.num_tokens, h);
  for (std::int64_t t = 0; t < p.num_tokens; ++t) {
    for (std::int64_t j = 0; j < p.k; ++j) {
      const std::int64_t row = row_of[t * p.k + j];
      if (row >= 0) out.row(t) += wm.map()(t, j) * ym.map().row(row);
    }
  }
  return detail::to_tensor<S>(out, Shape{p.num_tokens, h});
}

}  // namespace

Permutation permute_top1(std::span<const std::int64_t> expert_of, std::int64_t num_experts) {
  perf::OpScope scope("permute_top1");
  scope.attr("tokens", static_cast<std::int64_t>(expert_of.size())).attr("experts", num_experts);
  return group_by_expert("permute_top1", expert_of, 1, num_experts);
}

Permutation make_permutation(const Routing& r, std::int64_t num_experts) {
  constexpr std::string_view op = "make_permutation";
  perf::OpScope scope(op);
  scope.attr("tokens", r.num_tokens).attr("k", r.k).attr("experts", num_experts);
  MESHTEST_CHECK(r.num_tokens >= 0 && r.k >= 1 &&
                     static_cast<std::int64_t>(r.experts.size()) == r.num_tokens * r.k,
                 "{}: routing is for {} tokens x k {} but lists {} experts", op, r.num_tokens, r.k,
                 r.experts.size());
  if (!detail::is_unset(r.weights)) {
    detail::check_shape(op, "routing.weights", r.weights, Shape{r.num_tokens, r.k});
  }
  return group_by_expert(op, r.experts, r.k, num_experts);
}

std::int64_t expert_capacity(std::int64_t num_tokens, std::int64_t k, std::int64_t num_experts,
                             double factor) {
  MESHTEST_CHECK(std::isfinite(factor) && factor >= 0,
                 "expert_capacity: capacity factor is {}, expected a finite value >= 0", factor);
  MESHTEST_CHECK(num_tokens >= 0 && k >= 1 && num_experts >= 1,
                 "expert_capacity: {} tokens, k {}, {} experts: expected T >= 0, k >= 1, E >= 1",
                 num_tokens, k, num_experts);
  const double slots = static_cast<double>(num_tokens * k);
  const double c = std::ceil(slots / static_cast<double>(num_experts) * factor);
  // No expert can receive more than every slot: a huge factor keeps everything.
  return c >= slots ? num_tokens * k : static_cast<std::int64_t>(c);
}

std::int64_t apply_capacity(Permutation& p, std::int64_t capacity, DropPolicy policy,
                            const Tensor* weights) {
  perf::OpScope scope("apply_capacity");
  scope.attr("capacity", capacity).attr("rows", p.rows());
  MESHTEST_CHECK(capacity >= 0, "apply_capacity: capacity is {}, expected >= 0", capacity);
  check_permutation(p);
  std::vector<double> w;
  if (policy == DropPolicy::LowestWeight) w = weights_of(p, weights);
  std::vector<std::int64_t> kept;
  kept.reserve(p.slots.size());
  std::vector<std::int64_t> offsets{0};
  const std::size_t before = p.dropped.size();
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    const auto first = p.slots.begin() + p.offsets[e];
    const auto last = p.slots.begin() + p.offsets[e + 1];
    std::vector<std::int64_t> seg(first, last);
    if (p.count(e) > capacity) {
      if (policy == DropPolicy::LowestWeight) {
        // Largest weight first, lower slot on ties; the kept ones return to slot order.
        std::sort(seg.begin(), seg.end(), [&](std::int64_t a, std::int64_t b) {
          return w[a] > w[b] || (w[a] == w[b] && a < b);
        });
        std::sort(seg.begin(), seg.begin() + capacity);
      } else {
        std::sort(seg.begin(), seg.end());
      }
      p.dropped.insert(p.dropped.end(), seg.begin() + capacity, seg.end());
      seg.resize(static_cast<std::size_t>(capacity));
    }
    kept.insert(kept.end(), seg.begin(), seg.end());
    offsets.push_back(static_cast<std::int64_t>(kept.size()));
  }
  std::sort(p.dropped.begin(), p.dropped.end());
  p.slots = std::move(kept);
  p.offsets = std::move(offsets);
  return static_cast<std::int64_t>(p.dropped.size() - before);
}

Tensor permute(const Tensor& x, const Permutation& p) {
  constexpr std::string_view op = "permute";
  perf::OpScope scope(op);
  scope.input(x).attr("k", p.k);
  detail::check_rank(op, "x ([T, hidden])", x, 2);
  MESHTEST_CHECK(x.shape()[0] == p.num_tokens,
                 "permute: x has shape {} but the permutation is for {} tokens", x.shape(),
                 p.num_tokens);
  check_permutation(p);
  const std::int64_t h = x.shape()[1];
  Tensor out(Shape{p.rows(), h}, x.dtype(), Tensor::Uninitialized{});
  const std::size_t row_bytes = static_cast<std::size_t>(h) * dtype_size(x.dtype());
  if (row_bytes > 0) {
    for (std::int64_t i = 0; i < p.rows(); ++i) {
      std::memcpy(out.bytes() + i * row_bytes, x.bytes() + (p.slots[i] / p.k) * row_bytes,
                  row_bytes);
    }
  }
  scope.output(out);
  return out;
}

Tensor unpermute(const Tensor& y, const Permutation& p, const Tensor& weights) {
  constexpr std::string_view op = "unpermute";
  perf::OpScope scope(op);
  scope.input(y).input(weights).attr("k", p.k);
  detail::check_rank(op, "y ([rows, hidden])", y, 2);
  MESHTEST_CHECK(y.shape()[0] == p.rows(),
                 "unpermute: y has shape {} but the permutation keeps {} rows", y.shape(),
                 p.rows());
  detail::check_shape(op, "weights", weights, Shape{p.num_tokens, p.k});
  detail::check_dtype(op, "weights", weights, y.dtype());
  check_permutation(p);
  Tensor out = detail::visit_floating(
      y.dtype(), op, [&]<class S>(type_tag<S>) { return unpermute_impl<S>(y, p, weights); });
  scope.output(out).flops(2.0 * static_cast<double>(y.numel()));
  return out;
}

void check_permutation(const Permutation& p, const Routing* r) {
  constexpr std::string_view op = "check_permutation";
  MESHTEST_CHECK(p.num_tokens >= 0 && p.k >= 1 && p.num_experts >= 0,
                 "{}: {} tokens, k {}, {} experts: expected T >= 0, k >= 1, E >= 0", op,
                 p.num_tokens, p.k, p.num_experts);
  MESHTEST_CHECK(static_cast<std::int64_t>(p.offsets.size()) == p.num_experts + 1,
                 "{}: {} offsets for {} experts, expected {}", op, p.offsets.size(), p.num_experts,
                 p.num_experts + 1);
  MESHTEST_CHECK(p.offsets.front() == 0 && p.offsets.back() == p.rows(),
                 "{}: offsets run from {} to {}, expected 0 to {} (the rows)", op,
                 p.offsets.front(), p.offsets.back(), p.rows());
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    MESHTEST_CHECK(p.offsets[e] <= p.offsets[e + 1],
                   "{}: offsets decrease at expert {} ({} then {})", op, e, p.offsets[e],
                   p.offsets[e + 1]);
  }
  const std::int64_t n = p.num_tokens * p.k;
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  for (const auto* list : {&p.slots, &p.dropped}) {
    for (const std::int64_t s : *list) {
      MESHTEST_CHECK(s >= 0 && s < n, "{}: slot {} is outside [0, {}) (T {} x k {})", op, s, n,
                     p.num_tokens, p.k);
      MESHTEST_CHECK(seen[s] == 0, "{}: slot {} (token {}) appears twice", op, s, s / p.k);
      seen[s] = 1;
    }
  }
  const auto missing = std::find(seen.begin(), seen.end(), 0);
  MESHTEST_CHECK(missing == seen.end(), "{}: slot {} is neither kept nor dropped", op,
                 missing - seen.begin());
  if (r == nullptr) return;
  MESHTEST_CHECK(r->num_tokens == p.num_tokens && r->k == p.k &&
                     static_cast<std::int64_t>(r->experts.size()) == n,
                 "{}: routing is for {} tokens x k {} ({} experts listed), the permutation for "
                 "{} x {}",
                 op, r->num_tokens, r->k, r->experts.size(), p.num_tokens, p.k);
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    for (std::int64_t i = p.offsets[e]; i < p.offsets[e + 1]; ++i) {
      MESHTEST_CHECK(r->experts[p.slots[i]] == e,
                     "{}: slot {} (token {}) is in expert {}'s rows but routed to expert {}", op,
                     p.slots[i], p.slots[i] / p.k, e, r->experts[p.slots[i]]);
    }
  }
}

}  // namespace meshtest
