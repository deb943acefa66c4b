// fp8 block quantization: a 2-D tensor as fp8 codes with one f32 scale per block of
// block_rows x block_cols elements. Weights use square b x b blocks (b = 128 by default, also
// 256 and 512); activations use 1 x b groups along each row (per-token groups). A shape that
// the block does not divide gets ragged blocks at its bottom and right edges.
//
// Rule, per block: amax = max |x| over the block; scale = amax / fp8_max(format) (1 for an
// all-zero block); code = fp8_encode(x / scale); dequantized value = fp8_decode(code) * scale.
// So the block's largest magnitude maps to the format's largest value and every element keeps
// the format's relative precision: |x - dq| <= 2^-(mantissa bits + 1) |x| in the normal range,
// or half the smallest subnormal times the scale below it.
#pragma once

#include <cstdint>

#include "src/core/fp8.hpp"
#include "src/core/tensor.hpp"

namespace meshtest {

struct BlockQuantized {
  Tensor codes;   ///< u8 [rows, cols]
  Tensor scales;  ///< f32 [ceil(rows / block_rows), ceil(cols / block_cols)]
  std::int64_t block_rows = 0;
  std::int64_t block_cols = 0;
  Fp8Format format = Fp8Format::e4m3fn;
};

/// Quantizes a weight w [rows, cols] (f32, f64 or bf16) with block x block blocks. Throws Error
/// unless block is a positive multiple of 16, w is 2-D and floating, and every element is
/// finite (the first NaN or inf is named by its row and column).
BlockQuantized quantize_blocks(const Tensor& w, std::int64_t block = 128,
                               Fp8Format format = Fp8Format::e4m3fn);
/// Quantizes activations x [tokens, cols] with 1 x group groups along each row; the same
/// checks as quantize_blocks.
BlockQuantized quantize_groups(const Tensor& x, std::int64_t group = 128,
                               Fp8Format format = Fp8Format::e4m3fn);
/// The f32 values q stands for. Throws Error when codes and scales do not match the blocks.
Tensor dequantize(const BlockQuantized& q);

}  // namespace meshtest
