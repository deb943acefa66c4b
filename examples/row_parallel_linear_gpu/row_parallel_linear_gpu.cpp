// row_parallel_linear_gpu: the kernel's checks and launch, the partial products and their sum.
#include "row_parallel_linear_gpu.hpp"

#include <cstdint>
#include <string_view>

#include "dist/gpu/ccl/ccl.hpp"
#include "linear_kernel.hpp"
#include "src/core/error.hpp"
#include "src/gpu/runtime.hpp"

namespace row_parallel_gpu {

using meshtest::DType;
using meshtest::Shape;
using meshtest::Tensor;
using meshtest::dist::MeshDevice;
using meshtest::gpu::describe;

namespace {

constexpr int kRowAxis = 1;  // the devices of one row; a line mesh is one row

// An operand with elements must lie on the current device (an empty one holds no storage).
void check_device(std::string_view what, const DeviceTensor& t, int device) {
  MESHTEST_CHECK(t.empty() || t.device() == device,
                 "row_parallel_gpu::linear: {} {} is not on the current device cuda:{}", what,
                 describe(t), device);
}

template <class T>
DeviceTensor launch_typed(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* bias) {
  const std::int64_t m = x.shape()[0], n = w.shape()[0], k = x.shape()[1];
  DeviceTensor y(Shape{m, n}, x.dtype(), Tensor::Uninitialized{});
  if (y.empty()) return y;
  // The legacy default stream, as DeviceTensor's own copies: the inputs are complete (their
  // contract), and y is complete when this returns, as meshtest's collectives require.
  MESHTEST_CUDA_CHECK(launch_linear(x.data<T>(), w.data<T>(),
                                    bias != nullptr ? bias->data<T>() : nullptr, y.data<T>(), m, n,
                                    k, nullptr));
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  return y;
}

// linear() with `bias` checked when given, and added only when add_bias: every device of a row
// checks the same operands, so they all throw or none does.
DeviceTensor linear_impl(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* bias,
                         bool add_bias) {
  MESHTEST_CHECK(x.rank() == 2 && w.rank() == 2,
                 "row_parallel_gpu::linear: x {} and w {} must both be 2-D ([M, K] and [N, K])",
                 describe(x), describe(w));
  MESHTEST_CHECK(x.shape()[1] == w.shape()[1],
                 "row_parallel_gpu::linear: x {} and w {} disagree on K ({} and {} columns)",
                 describe(x), describe(w), x.shape()[1], w.shape()[1]);
  MESHTEST_CHECK(bias == nullptr || bias->shape() == Shape{w.shape()[0]},
                 "row_parallel_gpu::linear: bias {} does not match N = {} of w {}",
                 bias != nullptr ? describe(*bias) : "", w.shape()[0], describe(w));
  MESHTEST_CHECK(x.dtype() == w.dtype() && (bias == nullptr || bias->dtype() == x.dtype()),
                 "row_parallel_gpu::linear: dtypes differ (x {}, w {}{}{})", x.dtype(), w.dtype(),
                 bias != nullptr ? ", bias " : "",
                 bias != nullptr ? meshtest::dtype_name(bias->dtype()) : "");
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64,
                 "row_parallel_gpu::linear: dtype {} is not supported (f32 or f64)", x.dtype());
  MESHTEST_CHECK(x.shape()[0] <= kMaxRows && w.shape()[0] <= kMaxCols,
                 "row_parallel_gpu::linear: M = {} and N = {} exceed the kernel's grid (at most "
                 "{} and {})",
                 x.shape()[0], w.shape()[0], kMaxRows, kMaxCols);
  const int device = meshtest::gpu::current_device();
  check_device("x", x, device);
  check_device("w", w, device);
  if (bias != nullptr) check_device("bias", *bias, device);
  const DeviceTensor* added = add_bias ? bias : nullptr;
  return x.dtype() == DType::f32 ? launch_typed<float>(x, w, added)
                                 : launch_typed<double>(x, w, added);
}

}  // namespace

DeviceTensor linear(const DeviceTensor& x, const DeviceTensor& w) {
  return linear_impl(x, w, nullptr, false);
}

DeviceTensor linear(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias) {
  return linear_impl(x, w, &bias, true);
}

DeviceTensor row_parallel_linear(const MeshDevice& mesh, const DeviceTensor& x_local,
                                 const DeviceTensor& w_local, const DeviceTensor& bias) {
  DeviceTensor partial =
      linear_impl(x_local, w_local, &bias, /*add_bias=*/mesh.axis_index(kRowAxis) == 0);
  meshtest::dist::all_reduce_inplace(mesh, partial, {.axis = kRowAxis});
  return partial;
}

Tensor reference_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  MESHTEST_CHECK(x.rank() == 2 && w.rank() == 2 && x.shape()[1] == w.shape()[1] &&
                     bias.shape() == Shape{w.shape()[0]},
                 "reference_linear: shapes x {}, w {}, bias {} are not [M, K], [N, K], [N]",
                 x.shape(), w.shape(), bias.shape());
  const std::int64_t m_size = x.shape()[0], n_size = w.shape()[0], k_size = x.shape()[1];
  const Tensor x64 = x.astype(DType::f64), w64 = w.astype(DType::f64);
  const Tensor b64 = bias.astype(DType::f64);
  const double* xd = x64.data<double>();
  const double* wd = w64.data<double>();
  const double* bd = b64.data<double>();
  Tensor y(Shape{m_size, n_size}, DType::f64);
  double* yd = y.data<double>();
  for (std::int64_t m = 0; m < m_size; ++m) {
    for (std::int64_t n = 0; n < n_size; ++n) {
      double sum = 0;
      for (std::int64_t k = 0; k < k_size; ++k) sum += xd[m * k_size + k] * wd[n * k_size + k];
      yd[m * n_size + n] = sum + bd[n];
    }
  }
  return y;
}

}  // namespace row_parallel_gpu
