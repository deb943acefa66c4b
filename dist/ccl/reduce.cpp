// reduce: element-wise reduction of p terms in axis order, tiled so the accumulator stays in
// L1 and the destination is written once.
#include "dist/ccl/reduce.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <type_traits>

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist::detail {
namespace {

// T: the stored type; A: the accumulator (f32 for bf16 and f16, unsigned for integer sums).
template <class T, class A>
void reduce_as(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, ReduceOp op,
               const Stage& st) {
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
                    ReduceOp op, const Stage& st) {
  using U = std::make_unsigned_t<I>;  // sums wrap instead of overflowing
  if (op == ReduceOp::sum) return reduce_as<U, U>(dst, terms, n, op, st);
  reduce_as<I, I>(dst, terms, n, op, st);
}

}  // namespace

void reduce_stage(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
                  ReduceOp op, const Stage& stage) {
  if (n <= 0) return;
  MESHTEST_CHECK(!terms.empty() || stage.carry != nullptr, "reduce: no terms");
  MESHTEST_CHECK(stage.total > 0, "reduce: a stage of {} terms in all", stage.total);
  switch (t) {
    case DType::f32:
      return reduce_as<float, float>(dst, terms, n, op, stage);
    case DType::f64:
      return reduce_as<double, double>(dst, terms, n, op, stage);
    case DType::bf16:
      return reduce_as<bf16, float>(dst, terms, n, op, stage);
    case DType::f16:
      return reduce_as<f16, float>(dst, terms, n, op, stage);
    case DType::i32:
      return reduce_integer<std::int32_t>(dst, terms, n, op, stage);
    case DType::i64:
      return reduce_integer<std::int64_t>(dst, terms, n, op, stage);
    case DType::u8:
      break;
  }
  dist::fail("reduce: dtype {} cannot be reduced", t);
}

void reduce(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
            ReduceOp op) {
  reduce_stage(dst, terms, n, t, op,
               {.carry = nullptr, .last = true, .total = static_cast<std::int64_t>(terms.size())});
}

std::size_t accumulator_size(DType t) { return widens_to_f32(t) ? 4 : dtype_size(t); }

}  // namespace meshtest::dist::detail
