// meshtest-bench ccl's crafted exact data and the check of every output element against it.
#include <algorithm>

#include "bench/ccl_bench.hpp"

namespace meshtest::bench::ccl {
namespace {

// Element (row, col) of device j's input [R, C]: (j + 1) * k with k = (row*C + col) % 7 + 1.
// Every reduction over j is then k times a small integer: exact in every dtype (bf16 too).
double input_value(int j, std::int64_t row, std::int64_t col, std::int64_t cols) {
  return (j + 1) * static_cast<double>((row * cols + col) % 7 + 1);
}

/// The reduction over p devices of (j + 1) * k, divided by k.
double reduced_factor(ReduceOp op, int p) {
  switch (op) {
    case ReduceOp::sum:
      return p * (p + 1) / 2.0;
    case ReduceOp::max:
      return p;
    case ReduceOp::min:
      return 1;
    case ReduceOp::avg:
      return (p + 1) / 2.0;
  }
  return 0;
}

}  // namespace

Tensor make_input(const Layout& l, Op op, int me, DType t) {
  const std::int64_t c = op == Op::all_gather ? l.block : l.cols;
  Tensor x(l.shape(c), t);
  visit_dtype(t, [&]<class T>(type_tag<T>) {
    T* v = x.data<T>();
    for (std::int64_t r = 0; r < l.rows; ++r) {
      for (std::int64_t k = 0; k < c; ++k) v[r * c + k] = static_cast<T>(input_value(me, r, k, c));
    }
  });
  return x;
}

/// Elements of y (this device's output) that differ from the exactly predicted result.
std::int64_t count_wrong(const Layout& l, Op op, const Options& o, int me, int p, const Tensor& y) {
  const std::int64_t oc = op == Op::reduce_scatter ? l.block : l.cols;
  if (!(y.shape() == l.shape(oc)) || y.dtype() != o.dtype)
    return std::max<std::int64_t>(1, y.numel());
  const double f = reduced_factor(o.redop, p);
  std::int64_t wrong = 0;
  for (std::int64_t r = 0; r < l.rows; ++r) {
    for (std::int64_t k = 0; k < oc; ++k) {
      const std::int64_t j = k / l.block, kk = k % l.block;
      double want = 0;
      switch (op) {
        case Op::all_reduce:
          want = f * input_value(0, r, k, l.cols);
          break;
        case Op::all_gather:
          want = input_value(static_cast<int>(j), r, kk, l.block);
          break;
        case Op::reduce_scatter:
          want = f * input_value(0, r, me * l.block + k, l.cols);
          break;
        case Op::all_to_all:
          want = input_value(static_cast<int>(j), r, me * l.block + kk, l.cols);
          break;
      }
      wrong += y.item(r * oc + k) != want ? 1 : 0;
    }
  }
  return wrong;
}

}  // namespace meshtest::bench::ccl
