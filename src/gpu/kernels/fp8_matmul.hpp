// The fp8 block-quantized matmul on one GPU: the GPU versions of src/kernels/fp8_matmul.hpp's
// family (same inputs, f64 reference and configurations), family "fp8_matmul_gpu".
//
//   gpu v1  both operands dequantized to f32 by a kernel, then one cuBLAS f32 GEMM
//           (CUBLAS_COMPUTE_32F, no TF32): the dequantization is inside the timed run
//   gpu v2  a tiled kernel of our own (fp8_matmul_kernels.cu): codes staged in shared memory,
//           decoded to f16 (exact for e4m3), f16 tensor-core MMAs accumulating each K block in
//           f32, both scales applied once per K block
//   gpu v3  cuBLASLt's fp8 GEMM with Hopper's block scaling: w as A with 128 x 128 block scales
//           (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F), x as B with 1 x 128 group scales
//           (VEC128_32F), TN, f32 out. Needs sm_90, b = 128, k a multiple of 128, n of 16 and
//           m of 8. w's scales are repacked once (prepare); x's are transposed by a kernel in
//           each run (cuBLASLt reads them with the row index contiguous).
#pragma once

#include "src/gpu/kernels/family.hpp"

namespace meshtest::gpu {

GpuFamily fp8_matmul_gpu_family();

}  // namespace meshtest::gpu
