// Shared helpers of the reference ops: compute types, bf16 rounding, checks, Eigen views.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "src/core/tensor.hpp"

namespace meshtest::detail {

/// The type an op computes in for storage type S: double for f64, float for f32 and bf16
/// (the reference model computes bf16 ops in f32 and rounds their outputs).
template <class S>
using compute_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

/// A read-only row-major view with a row stride: one head's rows inside a [T, heads, d] tensor.
template <class C>
using StridedRowMap = Eigen::Map<const RowMatrix<C>, 0, Eigen::OuterStride<>>;

/// Rounds a compute-type value to storage type S and back: the rounding a PyTorch op with
/// S outputs applies. Identity for f32 and f64.
template <class S>
inline compute_t<S> round_as(compute_t<S> v) {
  if constexpr (std::is_same_v<S, bf16>) {
    return static_cast<float>(bf16(v));
  } else {
    return v;
  }
}

/// round_as for every element of a compute-type matrix or array expression, in place.
template <class S, class Derived>
void round_all(Eigen::DenseBase<Derived>& m) {
  if constexpr (std::is_same_v<S, bf16>) {
    m = m.template cast<bf16>().template cast<float>();
  }
}

/// Calls f(type_tag<S>{}) with S = float, double or bf16; any other dtype throws an Error
/// naming `op`.
template <class F>
decltype(auto) visit_floating(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::f32:
      return f(type_tag<float>{});
    case DType::f64:
      return f(type_tag<double>{});
    case DType::bf16:
      return f(type_tag<bf16>{});
    default:
      break;
  }
  fail("{}: dtype {} is not supported (expected f32, f64 or bf16)", op, t);
}

/// Whether `t` is a default-constructed Tensor (no shape, no bytes): an optional argument left
/// out (a bias, routing weights).
inline bool is_unset(const Tensor& t) { return t.rank() == 0 && t.nbytes() == 0; }

/// Throws an Error unless `t` has shape `want`; `op` and `name` say which tensor of which op.
void check_shape(std::string_view op, std::string_view name, const Tensor& t, const Shape& want);
/// Throws an Error unless `t` has dtype `want`.
void check_dtype(std::string_view op, std::string_view name, const Tensor& t, DType want);
/// Throws an Error unless `t` has rank `rank`.
void check_rank(std::string_view op, std::string_view name, const Tensor& t, int rank);

/// A read-only compute-type view of `rows` x `cols` row-major elements of `t` starting at
/// flat element `offset`: the tensor's own buffer when S is the compute type, else an owned
/// converted copy (bf16 -> f32). Not copyable: construct it where it is used.
template <class S>
class ComputeMatrix {
 public:
  using C = compute_t<S>;
  using Map = Eigen::Map<const RowMatrix<C>>;

  ComputeMatrix(const Tensor& t, std::int64_t offset, Eigen::Index rows, Eigen::Index cols)
      : rows_(rows), cols_(cols) {
    MESHTEST_CHECK(offset >= 0 && offset + rows * cols <= t.numel(),
                   "ComputeMatrix: [{}, {} + {}x{}) is outside {}", offset, offset, rows, cols,
                   describe(t));
    const S* p = t.data<S>() + offset;
    if constexpr (std::is_same_v<S, C>) {
      ptr_ = p;
    } else {
      copy_ = Eigen::Map<const RowMatrix<S>>(p, rows, cols).template cast<C>();
      ptr_ = copy_.data();
    }
  }
  /// The whole tensor as its 2-D view (rows = all dims but the last).
  explicit ComputeMatrix(const Tensor& t)
      : ComputeMatrix(t, 0, t.rank() == 0 ? 1 : t.shape().outer(t.rank() - 1), last_dim(t)) {}
  ComputeMatrix(const ComputeMatrix&) = delete;
  ComputeMatrix& operator=(const ComputeMatrix&) = delete;

  Map map() const { return Map(ptr_, rows_, cols_); }

 private:
  static Eigen::Index last_dim(const Tensor& t) {
    return t.rank() == 0 ? 1 : t.shape()[t.rank() - 1];
  }

  Eigen::Index rows_;
  Eigen::Index cols_;
  RowMatrix<C> copy_;
  const C* ptr_ = nullptr;
};

/// `rows` x `cols` row-major elements of storage type S at `p` as compute type: `p` itself when
/// S is the compute type, else converted into `buffer` (resized only when its size differs, so
/// a plan that keeps the buffer converts without allocating on later calls).
template <class S>
const compute_t<S>* compute_view(const S* p, Eigen::Index rows, Eigen::Index cols,
                                 RowMatrix<compute_t<S>>& buffer) {
  if constexpr (std::is_same_v<S, compute_t<S>>) {
    return p;
  } else {
    buffer = Eigen::Map<const RowMatrix<S>>(p, rows, cols).template cast<compute_t<S>>();
    return buffer.data();
  }
}

/// A new tensor of `shape` and storage type S holding `m` (rounded to S) in row-major order;
/// `m` must have shape.numel() elements.
template <class S, class Derived>
Tensor to_tensor(const Eigen::MatrixBase<Derived>& m, const Shape& shape) {
  Tensor out(shape, dtype_of<S>());
  MESHTEST_CHECK(m.size() == out.numel(), "to_tensor: {} values for shape {}", m.size(), shape);
  if (out.numel() > 0) {
    Eigen::Map<RowMatrix<S>>(out.data<S>(), m.rows(), m.cols()) = m.template cast<S>();
  }
  return out;
}

}  // namespace meshtest::detail
