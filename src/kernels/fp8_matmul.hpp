// The fp8 block-quantized matmul family: y [m, n] = dequant(xq, xs) · dequant(wq, ws)ᵀ, with
// activations x [m, k] quantized in 1 x b groups and the weight w [n, k] in b x b blocks
// (src/ops/block_quant.hpp, e4m3fn).
//
//   reference  both operands dequantized to f64, an f64 GEMM (Eigen)
//   v1         dequantize both to f32, one f32 GEMM (Eigen)
//   v2         per K block: the codes' values (unscaled) as f32 panels, their f32 GEMM, then
//              the partial product times x's group scale (per row) and w's block scale (per
//              N block) added to y: the scales applied once per block, not per element
//   v3         per K block: x's panel decoded with its group scale folded in, w's panel
//              unscaled, both through a 256-entry table into reused buffers; the GEMM's
//              columns of each N block scaled by w's block scale as they are added to y
#pragma once

#include <cstdint>
#include <string>

#include "src/kernels/family.hpp"
#include "src/ops/block_quant.hpp"

namespace meshtest::kernels {

/// The operands of one fp8 matmul: tensors {xq, xs, wq, ws} of Inputs.
struct Fp8MatmulOperands {
  BlockQuantized x;  ///< [m, k] in 1 x b groups
  BlockQuantized w;  ///< [n, k] in b x b blocks
  struct Dims {
    std::int64_t m = 0, n = 0, k = 0, block = 0, k_blocks = 0;
  } dims;
};

Fp8MatmulOperands fp8_matmul_operands(const Inputs& in);

Tensor fp8_matmul_reference(const Inputs& in);
Tensor fp8_matmul_v1(const Inputs& in);
Tensor fp8_matmul_v2(const Inputs& in);
Tensor fp8_matmul_v3(const Inputs& in);

/// A configuration of this family, its tolerance from the error model (f32 result against the
/// f64 reference, k products and two roundings per K block).
Config fp8_matmul_config(std::string name, std::int64_t m, std::int64_t n, std::int64_t k,
                         std::int64_t block);

Family fp8_matmul_family();

}  // namespace meshtest::kernels
