// fp8 block quantization and dequantization (a plain loop per block).
#include "src/ops/block_quant.hpp"

#include <algorithm>
#include <cmath>

#include "src/core/error.hpp"

namespace meshtest {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

void check_block(std::int64_t b, const char* what) {
  MESHTEST_CHECK(b > 0 && b % 16 == 0,
                 "fp8 block quantization: {} {} is not a positive multiple "
                 "of 16",
                 what, b);
}

BlockQuantized quantize(const Tensor& x, std::int64_t br, std::int64_t bc, Fp8Format format,
                        const char* what) {
  MESHTEST_CHECK(x.rank() == 2, "fp8 block quantization: {} must be 2-D, got {}", what, x.shape());
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64 || x.dtype() == DType::bf16,
                 "fp8 block quantization: {} must be f32, f64 or bf16, got {}", what, x.dtype());
  const Tensor v = x.astype(DType::f64);
  const double* p = v.data<double>();
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    MESHTEST_CHECK(std::isfinite(p[i]),
                   "fp8 block quantization: {} [{}, {}] is {} at row {}, column {}; only finite "
                   "values can be quantized",
                   what, rows, cols, p[i], i / cols, i % cols);
  }
  BlockQuantized q{.codes = Tensor(Shape({rows, cols}), DType::u8),
                   .scales = Tensor(Shape({ceil_div(rows, br), ceil_div(cols, bc)}), DType::f32),
                   .block_rows = br,
                   .block_cols = bc,
                   .format = format};
  auto* codes = q.codes.data<std::uint8_t>();
  auto* scales = q.scales.data<float>();
  const std::int64_t nbc = q.scales.shape()[1];
  for (std::int64_t r0 = 0; r0 < rows; r0 += br) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += bc) {
      const std::int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      double amax = 0;
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(p[r * cols + c]));
      }
      const float scale = amax > 0 ? static_cast<float>(amax) / fp8_max(format) : 1.0f;
      scales[(r0 / br) * nbc + c0 / bc] = scale;
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          codes[r * cols + c] = fp8_encode(static_cast<float>(p[r * cols + c] / scale), format);
        }
      }
    }
  }
  return q;
}

}  // namespace

BlockQuantized quantize_blocks(const Tensor& w, std::int64_t block, Fp8Format format) {
  check_block(block, "block");
  return quantize(w, block, block, format, "weight");
}

BlockQuantized quantize_groups(const Tensor& x, std::int64_t group, Fp8Format format) {
  check_block(group, "group");
  return quantize(x, 1, group, format, "activations");
}

Tensor dequantize(const BlockQuantized& q) {
  MESHTEST_CHECK(q.codes.rank() == 2 && q.codes.dtype() == DType::u8,
                 "fp8 dequantize: codes must be u8 [rows, cols], got {} {}", q.codes.dtype(),
                 q.codes.shape());
  MESHTEST_CHECK(q.block_rows > 0 && q.block_cols > 0, "fp8 dequantize: blocks of {} x {} elements",
                 q.block_rows, q.block_cols);
  const std::int64_t rows = q.codes.shape()[0], cols = q.codes.shape()[1];
  const Shape want({ceil_div(rows, q.block_rows), ceil_div(cols, q.block_cols)});
  MESHTEST_CHECK(q.scales.dtype() == DType::f32 && q.scales.shape() == want,
                 "fp8 dequantize: codes {} in {} x {} blocks need f32 scales {}, got {} {}",
                 q.codes.shape(), q.block_rows, q.block_cols, want, q.scales.dtype(),
                 q.scales.shape());
  Tensor out(Shape({rows, cols}), DType::f32);
  const auto* codes = q.codes.data<std::uint8_t>();
  const auto* scales = q.scales.data<float>();
  auto* y = out.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] = fp8_decode(codes[r * cols + c], q.format) *
                        scales[(r / q.block_rows) * want[1] + c / q.block_cols];
    }
  }
  return out;
}

}  // namespace meshtest
