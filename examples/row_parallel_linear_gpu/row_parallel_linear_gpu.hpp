// row_parallel_linear_gpu: y = x Wᵀ + b on GPU ranks, W split along K over the devices of a row:
// the project's own kernel for each partial product, meshtest's GPU all_reduce for the sum.
#pragma once

#include "dist/mesh/mesh_device.hpp"
#include "src/core/tensor.hpp"
#include "src/gpu/device_tensor.hpp"

namespace row_parallel_gpu {

using meshtest::gpu::DeviceTensor;

/// One GPU, no communication: x [M, K] and w [N, K] -> x wᵀ [M, N] by the project's kernel
/// (linear_kernel.cu), f32 or f64, on the current device; complete when it returns.
/// Throws meshtest::Error naming the operands when they are not 2-D, disagree on K or on the
/// dtype, have another dtype, lie on another device, or M or N exceed the kernel's grid.
DeviceTensor linear(const DeviceTensor& x, const DeviceTensor& w);
/// The same plus bias [N], added once to each row.
DeviceTensor linear(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias);

/// Collective over the devices of this device's row of `mesh` (axis 1; on a line mesh: every
/// device), called by all of them in the same order, on GPU ranks (each bound to its GPU:
/// meshtest::dist::gpu::bind_rank_to_gpu).
///   x_local: [M, K_i]  this device's columns of x [M, K], on its GPU
///   w_local: [N, K_i]  this device's columns of W [N, K] (PyTorch layout: [out, in])
///   bias:    [N]       the whole bias, the same on every device
/// -> y: [M, N] = x Wᵀ + b on every device of the row, the same bits on each. The K_i are
/// consecutive slices of K in axis order (any sizes, empty ones included). Each device computes
/// x_i W_iᵀ with linear(); the device of axis index 0 adds the bias (so it is added once), and
/// meshtest::dist::all_reduce sums the partials on the GPUs (NCCL). f32 or f64, one dtype for
/// all three. Throws meshtest::Error, before any communication, when the local operands do not
/// fit together (linear()'s errors, a bias that is not [N]); devices of a row that disagree on
/// M, N or the dtype get the all_reduce's meshtest::Error, on every device.
DeviceTensor row_parallel_linear(const meshtest::dist::MeshDevice& mesh,
                                 const DeviceTensor& x_local, const DeviceTensor& w_local,
                                 const DeviceTensor& bias);

/// The CPU reference: x [M, K], w [N, K], bias [N] (host tensors, any floating dtype) ->
/// x wᵀ + b [M, N] in f64, every sum accumulated in double by plain loops (its own error is
/// negligible next to an f32 result's). Fed magnitude()s of its inputs it gives each output's
/// sum of |terms|, the scale of meshtest's error model (src/check/tolerance.hpp).
meshtest::Tensor reference_linear(const meshtest::Tensor& x, const meshtest::Tensor& w,
                                  const meshtest::Tensor& bias);

}  // namespace row_parallel_gpu
