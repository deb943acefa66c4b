// row_parallel_linear: y = x Wᵀ + b with W split along K (its input dim) over the devices of a row.
#pragma once

#include <cstdint>

#include "dist/mesh/mesh_device.hpp"
#include "src/core/shape.hpp"
#include "src/core/tensor.hpp"

namespace row_parallel {

/// Collective over the devices of this device's row of `mesh` (axis 1; on a line mesh: every
/// device), called by all of them in the same order.
///   x_local: [M, K_i]  this device's columns of x [M, K]
///   w_local: [N, K_i]  this device's columns of W [N, K] (PyTorch layout: [out, in])
///   bias:    [N]       the whole bias, the same on every device
/// -> y: [M, N] = x Wᵀ + b, the same bits on every device of the row. The K_i are the devices'
/// consecutive slices of K in axis order (any sizes, empty ones included; k_slice gives the
/// even split). Each device computes its partial product x_i W_iᵀ, the device with axis index 0
/// adds the bias (so it is added once), and meshtest's all_reduce sums the partials.
/// f32, f64 or bf16, one dtype for all three. Throws meshtest::Error, before any communication,
/// when the local shapes or dtypes do not fit together; devices of a row that disagree on M, N
/// or the dtype get the all_reduce's meshtest::Error, on every device.
meshtest::Tensor row_parallel_linear(const meshtest::dist::MeshDevice& mesh,
                                     const meshtest::Tensor& x_local,
                                     const meshtest::Tensor& w_local, const meshtest::Tensor& bias);

/// This device's slice of K, [i K/p, (i + 1) K/p) for axis index i of p devices in its row.
/// Throws meshtest::Error naming K and p when K is negative or p does not divide it.
meshtest::Range k_slice(const meshtest::dist::MeshDevice& mesh, std::int64_t k);

/// The single-device reference: x [M, K], w [N, K], bias [N] -> x Wᵀ + b [M, N], every sum
/// accumulated in double by plain loops and rounded once to the inputs' dtype (f32 or f64).
meshtest::Tensor reference_linear(const meshtest::Tensor& x, const meshtest::Tensor& w,
                                  const meshtest::Tensor& bias);

}  // namespace row_parallel
