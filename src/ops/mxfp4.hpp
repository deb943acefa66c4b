// MXFP4: e2m1 values in blocks of 32 sharing one e8m0 scale; decode and a round-to-nearest encoder.
//
// Layout (as the gpt-oss checkpoints store it):
//   blocks: u8 [..., nblocks, 16]  two e2m1 codes per byte, low nibble first (element 2i in
//           the low nibble of byte i, element 2i+1 in the high nibble) -> 32 values per block
//   scales: u8 [..., nblocks]      e8m0: block scale 2^(s - 127)
//   value = e2m1(code) * 2^(s - 127), e2m1 codes 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6}, 8..15 the
//   same values negated (8 is -0).
//   decoded: [..., nblocks * 32]
#pragma once

#include <cstdint>
#include <string_view>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Values per MXFP4 block and bytes per packed block.
inline constexpr std::int64_t kMxfp4BlockValues = 32;
inline constexpr std::int64_t kMxfp4BlockBytes = 16;

/// The value of e2m1 code `code` (0..15); throws Error for a code > 15.
double e2m1_value(std::uint8_t code);
/// The e8m0 block scale 2^(s - 127) (s = 255 gives 2^128, not NaN, as the reference ldexp does).
double e8m0_scale(std::uint8_t s);

/// An MXFP4 tensor in checkpoint form.
struct Mxfp4 {
  Tensor blocks;  ///< u8 [..., nblocks, 16]
  Tensor scales;  ///< u8 [..., nblocks]
};

/// Throws Error (prefixed by `what`, e.g. the tensor name) unless blocks is u8 [..., nblocks, 16]
/// and scales is u8 with the shape of blocks minus its last dim.
void check_mxfp4(const Tensor& blocks, const Tensor& scales, std::string_view what = "mxfp4");
/// The same check on shapes and dtypes only (e.g. from a file header, before reading).
void check_mxfp4(const Shape& blocks, DType blocks_dtype, const Shape& scales, DType scales_dtype,
                 std::string_view what = "mxfp4");
/// The decoded shape of blocks [..., nblocks, 16]: [..., nblocks * 32].
Shape mxfp4_decoded_shape(const Shape& blocks);

/// Decodes MXFP4 to `out` (bf16, f16, f32 or f64; exact unless the scale over- or underflows it).
///   blocks: u8 [..., nblocks, 16], scales: u8 [..., nblocks]  ->  [..., nblocks * 32]
/// A slice of rows (any dim but the last) decodes as decode(blocks.slice, scales.slice).
Tensor mxfp4_decode(const Tensor& blocks, const Tensor& scales, DType out = DType::bf16);
inline Tensor mxfp4_decode(const Mxfp4& m, DType out = DType::bf16) {
  return mxfp4_decode(m.blocks, m.scales, out);
}

/// Encodes w (bf16, f16, f32 or f64, finite) block by block along its last dim:
///   w: [..., n], n % 32 == 0  ->  blocks u8 [..., n / 32, 16], scales u8 [..., n / 32]
/// Rule: with m = max |x| of the block, the shared exponent e is the smallest integer with
/// 6 * 2^e >= m (e = floor(log2 m) - 2, plus 1 if m > 6 * 2^that), clamped to [-127, 127]
/// (saturating at ±6 * 2^127); an all-zero block gets e = 0. Each x / 2^e is rounded to the
/// nearest e2m1 value, ties to the even code (0, 1, 2, 4 and 6 win their ties); the sign is
/// kept (-0 and negatives rounding to 0 give code 8). So |x - q| <= half the e2m1 step around
/// |x| / 2^e times 2^e, and decode(encode(v)) == v for any v that decode can produce;
/// encode(decode(b, s)) == (b, s) when each block's largest |code value| is 4 or 6.
Mxfp4 mxfp4_encode(const Tensor& w);

}  // namespace meshtest
