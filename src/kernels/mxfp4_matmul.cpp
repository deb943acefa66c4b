// The MXFP4 expert matmul family: y [t, n] = x · decode(w)ᵀ, x f32 [t, k] (activations,
// unquantized), w [n, k] in MXFP4 (blocks u8 [n, k / 32, 16], scales u8 [n, k / 32], as the
// gpt-oss experts store them).
//
//   reference  w decoded in f64 (exact), an f64 GEMM (Eigen)
//   v1         mxfp4_decode w to f32 (the whole matrix), one f32 GEMM
//   v2         fused: for each row of w and each block, its 32 values decoded through a
//              16-entry table into registers, dotted with each row of x, times the block's
//              scale: w is read once as 4-bit codes, never written out as f32
//   v3         fused by panels: 64 rows of w at a time decoded (scale folded in) into a reused
//              f32 panel that stays in cache, then an f32 GEMM of x with it
#include "src/kernels/mxfp4_matmul.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "src/check/tolerance.hpp"
#include "src/core/error.hpp"
#include "src/core/random.hpp"
#include "src/ops/mxfp4.hpp"

namespace meshtest::kernels {

namespace {

/// A configuration's tolerance on the normwise max relative error (family.hpp): the error
/// model's bound (src/check/tolerance.hpp) per unit of the output's scale max |r|, for an f32
/// result against the exact f64 reference. Terms per element: the k products (decoding and the
/// power-of-two block scales are exact in f32). The operands are zero-mean random, so max |r| is
/// the partial sums' magnitude.
double tolerance(std::int64_t k) {
  const ErrorModel m{.dtype = DType::f32, .terms = k, .reference = Reference::exact};
  return error_bound(m, 1.0, 1.0);
}

/// A configuration in MXFP4's own blocks of 32.
Config config(std::string name, std::int64_t m, std::int64_t n, std::int64_t k) {
  return {std::move(name), m, n, k, kMxfp4BlockValues, tolerance(k)};
}

using MatrixF = RowMatrix<float>;
using MatrixD = RowMatrix<double>;

constexpr std::int64_t kPanelRows = 64;

const std::array<float, 16>& e2m1_table() {
  static const std::array<float, 16> t = [] {
    std::array<float, 16> v{};
    for (int c = 0; c < 16; ++c) {
      v[static_cast<std::size_t>(c)] = static_cast<float>(e2m1_value(static_cast<std::uint8_t>(c)));
    }
    return v;
  }();
  return t;
}

Inputs make_mxfp4_inputs(const Config& c) {
  MESHTEST_CHECK(c.k % kMxfp4BlockValues == 0, "mxfp4_matmul: k {} is not a multiple of 32", c.k);
  Tensor x = random_normal(Shape({c.m, c.k}), DType::f32, {.seed = 2027, .stream = 1});
  const Tensor w =
      random_normal(Shape({c.n, c.k}), DType::f32, {.seed = 2027, .stream = 2}, 0.0, 0.05);
  Mxfp4 q = mxfp4_encode(w);
  return {.config = c, .tensors = {std::move(x), std::move(q.blocks), std::move(q.scales)}};
}

struct Operands {
  const Tensor& x;
  const Tensor& blocks;
  const Tensor& scales;
  std::int64_t t, n, k, nblocks;
};

Operands operands(const Inputs& in) {
  MESHTEST_CHECK(in.tensors.size() == 3,
                 "mxfp4_matmul: 3 operands (x, blocks, scales) expected, "
                 "got {}",
                 in.tensors.size());
  const Tensor& x = in.tensors[0];
  check_mxfp4(in.tensors[1], in.tensors[2], "mxfp4_matmul w");
  MESHTEST_CHECK(x.rank() == 2 && x.dtype() == DType::f32 && in.tensors[1].rank() == 3 &&
                     x.shape()[1] == in.tensors[1].shape()[1] * kMxfp4BlockValues,
                 "mxfp4_matmul: x {} {} and blocks {} must be f32 [t, k] and [n, k / 32, 16]",
                 x.dtype(), x.shape(), in.tensors[1].shape());
  return {x,
          in.tensors[1],
          in.tensors[2],
          x.shape()[0],
          in.tensors[1].shape()[0],
          x.shape()[1],
          in.tensors[1].shape()[1]};
}

/// Rows [r0, r0 + rows) of w decoded with their scales into `panel` (rows x k).
void decode_rows(const Operands& o, std::int64_t r0, std::int64_t rows, MatrixF& panel) {
  const std::array<float, 16>& table = e2m1_table();
  const auto* b = o.blocks.data<std::uint8_t>();
  const auto* s = o.scales.data<std::uint8_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    float* dst = panel.row(r).data();
    for (std::int64_t j = 0; j < o.nblocks; ++j) {
      const auto scale = static_cast<float>(e8m0_scale(s[(r0 + r) * o.nblocks + j]));
      const std::uint8_t* bytes = b + ((r0 + r) * o.nblocks + j) * kMxfp4BlockBytes;
      for (std::int64_t i = 0; i < kMxfp4BlockBytes; ++i) {
        dst[2 * i] = table[bytes[i] & 0x0F] * scale;
        dst[2 * i + 1] = table[bytes[i] >> 4] * scale;
      }
      dst += kMxfp4BlockValues;
    }
  }
}

}  // namespace

Tensor mxfp4_matmul_reference(const Inputs& in) {
  const Operands o = operands(in);
  const Tensor w = mxfp4_decode(o.blocks, o.scales, DType::f64);
  const Tensor x = o.x.astype(DType::f64);
  Tensor y(Shape({o.t, o.n}), DType::f64);
  y.matrix<double>().noalias() = x.matrix<double>() * w.matrix<double>().transpose();
  return y;
}

Tensor mxfp4_matmul_v1(const Inputs& in) {
  const Operands o = operands(in);
  const Tensor w = mxfp4_decode(o.blocks, o.scales, DType::f32);
  Tensor y(Shape({o.t, o.n}), DType::f32);
  y.matrix<float>().noalias() = o.x.matrix<float>() * w.matrix<float>().transpose();
  return y;
}

Tensor mxfp4_matmul_v2(const Inputs& in) {
  const Operands o = operands(in);
  const std::array<float, 16>& table = e2m1_table();
  const auto* b = o.blocks.data<std::uint8_t>();
  const auto* s = o.scales.data<std::uint8_t>();
  const auto* x = o.x.data<float>();
  Tensor out(Shape({o.t, o.n}), DType::f32);
  auto* y = out.data<float>();
  std::array<float, kMxfp4BlockValues> v{};
  for (std::int64_t r = 0; r < o.n; ++r) {
    for (std::int64_t j = 0; j < o.nblocks; ++j) {
      const std::uint8_t* bytes = b + (r * o.nblocks + j) * kMxfp4BlockBytes;
      for (std::size_t i = 0; i < kMxfp4BlockBytes; ++i) {
        v[2 * i] = table[bytes[i] & 0x0F];
        v[2 * i + 1] = table[bytes[i] >> 4];
      }
      const auto scale = static_cast<float>(e8m0_scale(s[r * o.nblocks + j]));
      for (std::int64_t t = 0; t < o.t; ++t) {
        const float* xs = x + t * o.k + j * kMxfp4BlockValues;
        float dot = 0;
        for (std::size_t i = 0; i < kMxfp4BlockValues; ++i) dot += v[i] * xs[i];
        y[t * o.n + r] += dot * scale;
      }
    }
  }
  return out;
}

Tensor mxfp4_matmul_v3(const Inputs& in) {
  const Operands o = operands(in);
  Tensor out(Shape({o.t, o.n}), DType::f32);
  auto y = out.matrix<float>();
  const auto x = o.x.matrix<float>();
  MatrixF panel(kPanelRows, o.k);
  for (std::int64_t r0 = 0; r0 < o.n; r0 += kPanelRows) {
    const std::int64_t rows = std::min(kPanelRows, o.n - r0);
    decode_rows(o, r0, rows, panel);
    y.middleCols(r0, rows).noalias() = x * panel.topRows(rows).transpose();
  }
  return out;
}

Family mxfp4_matmul_family() {
  return {
      .name = "mxfp4_matmul",
      .description =
          "y = x · decode(w)ᵀ, x f32 [t, k], w MXFP4 [n, k] (e2m1 in blocks of 32, "
          "e8m0 scales), as the gpt-oss experts",
      .make_inputs = make_mxfp4_inputs,
      .reference = mxfp4_matmul_reference,
      .versions = {{"v1", "decode the whole weight to f32, one f32 GEMM", mxfp4_matmul_v1},
                   {"v2",
                    "fused: each block decoded through a table into registers, dotted "
                    "with x, times its scale",
                    mxfp4_matmul_v2},
                   {"v3",
                    "fused by panels: 64 rows decoded (scale folded in) into a cached "
                    "panel, then an f32 GEMM",
                    mxfp4_matmul_v3}},
      .configs = {config("decode t=1", 1, 2880, 2880), config("decode t=4", 4, 2880, 2880),
                  config("decode t=8", 8, 2880, 2880), config("prefill t=128", 128, 2880, 2880),
                  config("non-aligned n", 8, 1000, 2880), config("square 2048", 2048, 2048, 2048)},
      .quick_configs = {config("one token", 1, 64, 96), config("few tokens", 5, 70, 128),
                        config("one block", 3, 1, 32), config("panels", 16, 130, 64)},
      .flops = [](const Config& c) { return 2.0 * static_cast<double>(c.m * c.n * c.k); },
  };
}

}  // namespace meshtest::kernels
