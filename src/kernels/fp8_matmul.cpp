// The fp8 block-quantized matmul family (see the header for the versions).
#include "src/kernels/fp8_matmul.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "src/check/tolerance.hpp"
#include "src/core/error.hpp"
#include "src/core/random.hpp"

namespace meshtest::kernels {

namespace {

/// A configuration's tolerance on the normwise max relative error (family.hpp): the error
/// model's bound (src/check/tolerance.hpp) per unit of the output's scale max |r|, for an f32
/// result against the exact f64 reference. Terms per element: the k products and, in v2 and v3,
/// two roundings per K block (the scales' product, the scaled partial's addition); v1's rounding
/// of each dequantized operand is, like a product's, relative to its term. The operands are
/// zero-mean random, so max |r| is the partial sums' magnitude.
double tolerance(std::int64_t k, std::int64_t block) {
  const ErrorModel m{.dtype = DType::f32,
                     .terms = k + 2 * ((k + block - 1) / block),
                     .reference = Reference::exact};
  return error_bound(m, 1.0, 1.0);
}

Config config(std::string name, std::int64_t m, std::int64_t n, std::int64_t k,
              std::int64_t block) {
  return fp8_matmul_config(std::move(name), m, n, k, block);
}

constexpr Fp8Format kFormat = Fp8Format::e4m3fn;

using MatrixF = RowMatrix<float>;
using MatrixD = RowMatrix<double>;

/// The f32 value of every code, for v3's decode.
const std::array<float, 256>& code_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int c = 0; c < 256; ++c)
      v[static_cast<std::size_t>(c)] = fp8_decode(static_cast<std::uint8_t>(c), kFormat);
    return v;
  }();
  return t;
}

Inputs make_fp8_inputs(const Config& c) {
  const Tensor x = random_normal(Shape({c.m, c.k}), DType::f32, {.seed = 2026, .stream = 1});
  const Tensor w =
      random_normal(Shape({c.n, c.k}), DType::f32, {.seed = 2026, .stream = 2}, 0.0, 0.05);
  BlockQuantized xq = quantize_groups(x, c.block, kFormat);
  BlockQuantized wq = quantize_blocks(w, c.block, kFormat);
  return {.config = c,
          .tensors = {std::move(xq.codes), std::move(xq.scales), std::move(wq.codes),
                      std::move(wq.scales)}};
}

/// Unscaled code values of columns [k0, k0 + kw) of codes [rows, k], as f32.
MatrixF panel(const Tensor& codes, std::int64_t k0, std::int64_t kw) {
  const std::int64_t rows = codes.shape()[0], k = codes.shape()[1];
  const auto* c = codes.data<std::uint8_t>();
  MatrixF p(rows, kw);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < kw; ++j) p(r, j) = fp8_decode(c[r * k + k0 + j], kFormat);
  }
  return p;
}

}  // namespace

Config fp8_matmul_config(std::string name, std::int64_t m, std::int64_t n, std::int64_t k,
                         std::int64_t block) {
  return {std::move(name), m, n, k, block, tolerance(k, block)};
}

Fp8MatmulOperands fp8_matmul_operands(const Inputs& in) {
  MESHTEST_CHECK(in.tensors.size() == 4, "fp8_matmul: 4 operands (xq, xs, wq, ws) expected, got {}",
                 in.tensors.size());
  const std::int64_t b = in.config.block;
  Fp8MatmulOperands o{.x = {.codes = in.tensors[0],
                            .scales = in.tensors[1],
                            .block_rows = 1,
                            .block_cols = b,
                            .format = kFormat},
                      .w = {.codes = in.tensors[2],
                            .scales = in.tensors[3],
                            .block_rows = b,
                            .block_cols = b,
                            .format = kFormat},
                      .dims = {}};
  MESHTEST_CHECK(o.x.codes.rank() == 2 && o.w.codes.rank() == 2 &&
                     o.x.codes.shape()[1] == o.w.codes.shape()[1],
                 "fp8_matmul: x {} and w {} must be [m, k] and [n, k]", o.x.codes.shape(),
                 o.w.codes.shape());
  o.dims = {.m = o.x.codes.shape()[0],
            .n = o.w.codes.shape()[0],
            .k = o.x.codes.shape()[1],
            .block = b,
            .k_blocks = o.x.scales.shape()[1]};
  return o;
}

Tensor fp8_matmul_reference(const Inputs& in) {
  const Fp8MatmulOperands o = fp8_matmul_operands(in);
  // Dequantized in f64, where decode(code) * scale is exact.
  const auto dequant64 = [](const BlockQuantized& q) {
    const std::int64_t rows = q.codes.shape()[0], cols = q.codes.shape()[1];
    const std::int64_t nbc = q.scales.shape()[1];
    MatrixD d(rows, cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        d(r, c) =
            static_cast<double>(fp8_decode(q.codes.data<std::uint8_t>()[r * cols + c], q.format)) *
            static_cast<double>(
                q.scales.data<float>()[(r / q.block_rows) * nbc + c / q.block_cols]);
      }
    }
    return d;
  };
  const MatrixD x = dequant64(o.x), w = dequant64(o.w);
  Tensor y(Shape({x.rows(), w.rows()}), DType::f64);
  y.matrix<double>().noalias() = x * w.transpose();
  return y;
}

Tensor fp8_matmul_v1(const Inputs& in) {
  const Fp8MatmulOperands o = fp8_matmul_operands(in);
  const Tensor x = dequantize(o.x), w = dequantize(o.w);
  Tensor y(Shape({x.shape()[0], w.shape()[0]}), DType::f32);
  y.matrix<float>().noalias() = x.matrix<float>() * w.matrix<float>().transpose();
  return y;
}

Tensor fp8_matmul_v2(const Inputs& in) {
  const Fp8MatmulOperands o = fp8_matmul_operands(in);
  const auto [m, n, k, b, nk] = o.dims;  // nk: the K blocks
  const auto* xs = o.x.scales.data<float>();
  const auto* ws = o.w.scales.data<float>();
  Tensor out(Shape({m, n}), DType::f32);
  auto y = out.matrix<float>();
  for (std::int64_t kb = 0; kb < nk; ++kb) {
    const std::int64_t k0 = kb * b, kw = std::min(b, k - k0);
    const MatrixF xp = panel(o.x.codes, k0, kw), wp = panel(o.w.codes, k0, kw);
    const MatrixF p = xp * wp.transpose();
    for (std::int64_t r = 0; r < m; ++r) {
      for (std::int64_t n0 = 0; n0 < n; n0 += b) {
        const float s = xs[r * nk + kb] * ws[(n0 / b) * nk + kb];
        const std::int64_t nw = std::min(b, n - n0);
        y.row(r).segment(n0, nw) += s * p.row(r).segment(n0, nw);
      }
    }
  }
  return out;
}

Tensor fp8_matmul_v3(const Inputs& in) {
  const Fp8MatmulOperands o = fp8_matmul_operands(in);
  const auto [m, n, k, b, nk] = o.dims;  // nk: the K blocks
  const auto* xc = o.x.codes.data<std::uint8_t>();
  const auto* wc = o.w.codes.data<std::uint8_t>();
  const auto* xs = o.x.scales.data<float>();
  const auto* ws = o.w.scales.data<float>();
  const std::array<float, 256>& table = code_table();
  Tensor out(Shape({m, n}), DType::f32);
  auto y = out.matrix<float>();
  MatrixF xp(m, b), wp(n, b), p(m, n);
  for (std::int64_t kb = 0; kb < nk; ++kb) {
    const std::int64_t k0 = kb * b, kw = std::min(b, k - k0);
    for (std::int64_t r = 0; r < m; ++r) {
      const float s = xs[r * nk + kb];
      for (std::int64_t j = 0; j < kw; ++j) xp(r, j) = table[xc[r * k + k0 + j]] * s;
    }
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t j = 0; j < kw; ++j) wp(r, j) = table[wc[r * k + k0 + j]];
    }
    p.noalias() = xp.leftCols(kw) * wp.leftCols(kw).transpose();
    for (std::int64_t n0 = 0; n0 < n; n0 += b) {
      const std::int64_t nw = std::min(b, n - n0);
      y.middleCols(n0, nw) += ws[(n0 / b) * nk + kb] * p.middleCols(n0, nw);
    }
  }
  return out;
}

Family fp8_matmul_family() {
  return {
      .name = "fp8_matmul",
      .description =
          "y = dequant(xq, xs) · dequant(wq, ws)ᵀ, e4m3fn, x in 1 x b groups, w in "
          "b x b blocks",
      .make_inputs = make_fp8_inputs,
      .reference = fp8_matmul_reference,
      .versions = {{"v1", "dequantize both operands to f32, one f32 GEMM", fp8_matmul_v1},
                   {"v2", "per K block: GEMM of the unscaled codes, both scales once per block",
                    fp8_matmul_v2},
                   {"v3",
                    "per K block: table decode with x's scale folded in, reused panels, "
                    "w's scale per N block",
                    fp8_matmul_v3}},
      .configs = {config("small", 128, 128, 128, 128), config("medium", 512, 1024, 1024, 128),
                  config("large", 2048, 2048, 2048, 128),
                  config("non-aligned", 1000, 1100, 1300, 128),
                  config("1536 in 512 blocks", 1536, 1536, 1536, 512),
                  config("asymmetric", 1024, 2048, 4096, 128), config("decode", 8, 2048, 2048, 128),
                  // The shapes and blocks the seed's benchmark adds: 256- and 512-wide blocks,
                  // 4096^2 and a wide output.
                  config("medium 256-blocks", 1024, 1024, 1024, 256),
                  config("xlarge 512-blocks", 4096, 4096, 4096, 512),
                  config("wide", 2048, 4096, 2048, 128)},
      .quick_configs = {config("tiny", 16, 32, 48, 16), config("ragged", 33, 40, 70, 16),
                        config("one row", 1, 16, 16, 16), config("one K block", 8, 128, 96, 128),
                        config("32-blocks", 64, 96, 160, 32)},
      .flops = [](const Config& c) { return 2.0 * static_cast<double>(c.m * c.n * c.k); },
  };
}

}  // namespace meshtest::kernels
