// reduce: element-wise reduction of p terms in axis order, the accumulator in an L1 tile (or,
// for sums from memory, in registers), the destination written once.
#include "dist/ccl/reduce.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <type_traits>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {
namespace {

// Sums and averages of terms read from memory: every term's stream read together, kBlock
// elements of each at a time, the block's accumulators in registers. Reading the p streams side
// by side, rather than one tile of one term after another, keeps the hardware prefetchers on
// all of them (bench ccl, reduce_scatter of 8-64 MiB at 8 and 16 devices on a 16-core Xeon:
// 1.2-1.4x the tiled loop's bandwidth); from the caches it ran at half the tiled loop's (64 KiB
// - 4 MiB), hence kSideBySideFrom (docs/ccl-bench.md). The additions are the tiled loop's, in
// the same order.
template <class T, class A>
void sum_blocks(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, bool avg,
                const Stage& st) {
  // Two cache lines of accumulators: enough independent additions to hide their latency.
  constexpr std::int64_t kBlock = 128 / static_cast<std::int64_t>(sizeof(A));
  const auto* carry = reinterpret_cast<const A*>(st.carry);
  const std::size_t p = terms.size();
  const auto term = [&](std::size_t j) { return reinterpret_cast<const T*>(terms[j]); };
  const auto block = [&](std::int64_t k, auto len) {
    std::array<A, kBlock> acc;
    std::size_t j = 0;
    if (carry != nullptr) {
      for (std::int64_t i = 0; i < len; ++i) acc[i] = carry[k + i];
    } else {
      for (std::int64_t i = 0; i < len; ++i) acc[i] = static_cast<A>(term(0)[k + i]);
      j = 1;
    }
    for (; j < p; ++j) {
      const T* t = term(j) + k;
      for (std::int64_t i = 0; i < len; ++i) acc[i] += static_cast<A>(t[i]);
    }
    if (!st.last) {
      for (std::int64_t i = 0; i < len; ++i) reinterpret_cast<A*>(dst)[k + i] = acc[i];
      return;
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (avg) {
        for (std::int64_t i = 0; i < len; ++i) acc[i] /= static_cast<A>(st.total);
      }
    }
    for (std::int64_t i = 0; i < len; ++i)
      reinterpret_cast<T*>(dst)[k + i] = static_cast<T>(acc[i]);
  };
  std::int64_t k = 0;
  for (; k + kBlock <= n; k += kBlock) block(k, std::integral_constant<std::int64_t, kBlock>{});
  if (k < n) block(k, n - k);
}

// T: the stored type; A: the accumulator (f32 for bf16 and f16, unsigned for integer sums).
template <class T, class A>
void reduce_as(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, ReduceOp op,
               const Stage& st, bool side_by_side) {
  if (side_by_side && (op == ReduceOp::sum || op == ReduceOp::avg)) {
    return sum_blocks<T, A>(dst, terms, n, op == ReduceOp::avg, st);
  }
  // Tiles of one term after another, the accumulator in L1.
  using Acc = Eigen::Array<A, Eigen::Dynamic, 1>;
  using In = Eigen::Array<T, Eigen::Dynamic, 1>;
  constexpr std::int64_t kTile = 2048;
  std::array<A, kTile> tile;
  const auto* carry = reinterpret_cast<const A*>(st.carry);
  const std::size_t first = carry != nullptr ? 0 : 1;  // terms still to combine from
  for (std::int64_t at = 0; at < n; at += kTile) {
    const Eigen::Index len = std::min(kTile, n - at);
    Eigen::Map<Acc> acc(tile.data(), len);
    auto term = [&](std::size_t j) {
      return Eigen::Map<const In>(reinterpret_cast<const T*>(terms[j]) + at, len)
          .template cast<A>();
    };
    if (carry != nullptr) {
      acc = Eigen::Map<const Acc>(carry + at, len);
    } else {
      acc = term(0);
    }
    for (std::size_t j = first; j < terms.size(); ++j) {
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          acc += term(j);
          break;
        case ReduceOp::max:
          acc = acc.max(term(j));
          break;
        case ReduceOp::min:
          acc = acc.min(term(j));
          break;
      }
    }
    if (!st.last) {
      Eigen::Map<Acc>(reinterpret_cast<A*>(dst) + at, len) = acc;
      continue;
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (op == ReduceOp::avg) acc /= static_cast<A>(st.total);
    }
    Eigen::Map<In>(reinterpret_cast<T*>(dst) + at, len) = acc.template cast<T>();
  }
}

template <class I>
void reduce_integer(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n,
                    ReduceOp op, const Stage& st, bool side_by_side) {
  using U = std::make_unsigned_t<I>;  // sums wrap instead of overflowing
  if (op == ReduceOp::sum) return reduce_as<U, U>(dst, terms, n, op, st, side_by_side);
  reduce_as<I, I>(dst, terms, n, op, st, side_by_side);
}

}  // namespace

void reduce_stage(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
                  ReduceOp op, const Stage& stage, std::size_t footprint) {
  if (n <= 0) return;
  MESHTEST_CHECK(!terms.empty() || stage.carry != nullptr, "reduce: no terms");
  MESHTEST_CHECK(stage.total > 0, "reduce: a stage of {} terms in all", stage.total);
  if (footprint == 0) footprint = static_cast<std::size_t>(n) * terms.size() * dtype_size(t);
  const bool side = footprint >= kSideBySideFrom;
  switch (t) {
    case DType::f32:
      return reduce_as<float, float>(dst, terms, n, op, stage, side);
    case DType::f64:
      return reduce_as<double, double>(dst, terms, n, op, stage, side);
    case DType::bf16:
      return reduce_as<bf16, float>(dst, terms, n, op, stage, side);
    case DType::f16:
      return reduce_as<f16, float>(dst, terms, n, op, stage, side);
    case DType::i32:
      return reduce_integer<std::int32_t>(dst, terms, n, op, stage, side);
    case DType::i64:
      return reduce_integer<std::int64_t>(dst, terms, n, op, stage, side);
    case DType::u8:
      break;
  }
  dist::fail("reduce: dtype {} cannot be reduced", t);
}

void reduce(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
            ReduceOp op, std::size_t footprint) {
  reduce_stage(dst, terms, n, t, op,
               {.carry = nullptr, .last = true, .total = static_cast<std::int64_t>(terms.size())},
               footprint);
}

std::size_t accumulator_size(DType t) { return widens_to_f32(t) ? 4 : dtype_size(t); }

}  // namespace meshtest::dist::detail
