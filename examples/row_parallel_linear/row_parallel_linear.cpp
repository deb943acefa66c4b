// row_parallel_linear: partial products on each device, the bias once, summed by all_reduce.
#include "row_parallel_linear.hpp"

#include "dist/ccl/all_reduce.hpp"
#include "src/core/error.hpp"
#include "src/ops/linear.hpp"

namespace row_parallel {

using meshtest::DType;
using meshtest::Range;
using meshtest::Shape;
using meshtest::Tensor;
using meshtest::dist::MeshDevice;

namespace {

constexpr int kRowAxis = 1;  // the devices of one row; a line mesh is one row

void check_operands(const MeshDevice& mesh, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int id = mesh.device_id();
  MESHTEST_CHECK(x.rank() == 2 && w.rank() == 2,
                 "row_parallel_linear on device {}: x_local {} and w_local {} must both be 2-D "
                 "([M, K_i] and [N, K_i])",
                 id, x.shape(), w.shape());
  MESHTEST_CHECK(x.shape()[1] == w.shape()[1],
                 "row_parallel_linear on device {}: x_local {} and w_local {} hold different "
                 "slices of K ({} and {} columns)",
                 id, x.shape(), w.shape(), x.shape()[1], w.shape()[1]);
  MESHTEST_CHECK(b.shape() == Shape{w.shape()[0]},
                 "row_parallel_linear on device {}: bias {} does not match N = {} of w_local {}",
                 id, b.shape(), w.shape()[0], w.shape());
  MESHTEST_CHECK(x.dtype() == w.dtype() && x.dtype() == b.dtype(),
                 "row_parallel_linear on device {}: dtypes differ (x {}, w {}, bias {})", id,
                 x.dtype(), w.dtype(), b.dtype());
}

}  // namespace

Tensor row_parallel_linear(const MeshDevice& mesh, const Tensor& x_local, const Tensor& w_local,
                           const Tensor& bias) {
  check_operands(mesh, x_local, w_local, bias);
  Tensor partial = mesh.axis_index(kRowAxis) == 0 ? meshtest::linear(x_local, w_local, bias)
                                                  : meshtest::linear(x_local, w_local);
  meshtest::dist::all_reduce_inplace(mesh, partial, {.axis = kRowAxis});
  return partial;
}

Range k_slice(const MeshDevice& mesh, std::int64_t k) {
  const int p = mesh.axis_size(kRowAxis);
  MESHTEST_CHECK(k >= 0 && k % p == 0,
                 "row_parallel_linear: K = {} does not split evenly over the {} devices of a row "
                 "(K must be a non-negative multiple of {})",
                 k, p, p);
  const std::int64_t size = k / p;
  return {.start = mesh.axis_index(kRowAxis) * size, .size = size};
}

Tensor reference_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  MESHTEST_CHECK(x.rank() == 2 && w.rank() == 2 && x.shape()[1] == w.shape()[1] &&
                     bias.shape() == Shape{w.shape()[0]},
                 "reference_linear: shapes x {}, w {}, bias {} are not [M, K], [N, K], [N]",
                 x.shape(), w.shape(), bias.shape());
  const std::int64_t m_size = x.shape()[0], n_size = w.shape()[0], k_size = x.shape()[1];
  Tensor y(Shape{m_size, n_size}, DType::f64);
  const Tensor x64 = x.astype(DType::f64), w64 = w.astype(DType::f64);
  const Tensor b64 = bias.astype(DType::f64);
  const double* xd = x64.data<double>();
  const double* wd = w64.data<double>();
  double* yd = y.data<double>();
  for (std::int64_t m = 0; m < m_size; ++m) {
    for (std::int64_t n = 0; n < n_size; ++n) {
      double sum = b64.data<double>()[n];
      for (std::int64_t k = 0; k < k_size; ++k) {
        sum += xd[m * k_size + k] * wd[n * k_size + k];
      }
      yd[m * n_size + n] = sum;
    }
  }
  return y.astype(x.dtype());
}

}  // namespace row_parallel
