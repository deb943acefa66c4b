// tp_linear (GPU): the column-parallel and row-parallel linear of tensor parallelism on this
// rank's GPU, over the devices of one mesh axis.
//
// With p devices on the TP axis and device index i, a linear y = x Wᵀ + b, W: [out, in]:
//   column-parallel: device i holds W's rows R_i and b[R_i]; x [..., in] is the same on every
//     device of the axis; y_i = x W[R_i]ᵀ + b[R_i] -> [..., |R_i|], y placed Shard(-1) over the
//     axis. Local: no communication.
//   row-parallel: device i holds W's columns C_i and x's matching columns x_i [..., |C_i|];
//     y = all_reduce_axis(x_i W[:, C_i]ᵀ (+ b on index 0)) -> [..., out], the same on every
//     device of the axis. The bias joins device 0's partial inside its GEMM, before its one
//     rounding, as the CPU TP blocks do (dist/parallel/tensor_parallel.hpp), so over one device
//     the result is the single-device linear bit for bit.
// Both queue their GEMM on blas.stream(); the outputs are complete after blas.synchronize()
// (row_parallel_linear returns a complete output: the all_reduce waits for it).
#pragma once

#include <string>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::dist {

/// The TP axis of the GPU tensor-parallel ops: 0, 1 or kAllAxes (every device of the mesh).
struct GpuTpOptions {
  int axis = kAllAxes;
  /// The all_reduce's numerics (dist/gpu/ccl/ccl.hpp): exact (the CPU path's bits) by default.
  Numerics numerics = Numerics::from_env;
};

/// Column-parallel linear: meshtest::gpu::linear(x, weight, bias) on this device's shard (see the
/// file comment). Local: an Error (meshtest::gpu::linear's) on this device only.
///   x: [..., in], weight: [out_i, in], bias: [out_i] (or none)  ->  [..., out_i]
DeviceTensor column_parallel_linear(meshtest::gpu::Blas& blas, const DeviceTensor& x,
                                    const DeviceTensor& weight, const DeviceTensor* bias);

/// Row-parallel linear (see the file comment). Collective over opt.axis: every device calls it
/// with its shard; bad input on any device (shapes, dtypes, devices: meshtest::gpu::check_linear)
/// is the same Error on every device of the axis, before the all_reduce. A device whose own
/// checks pass queues its GEMM first and the devices agree while it runs (the agreement's MPI
/// round trip does not leave the GPU idle); a device whose checks fail queues nothing. bias is
/// read on axis index 0 only (the others' may be null); its shape is checked wherever it is given.
///   x: [..., in_i], weight: [out, in_i], bias: [out]  ->  [..., out]
DeviceTensor row_parallel_linear(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                 const DeviceTensor& x, const DeviceTensor& weight,
                                 const DeviceTensor* bias, const GpuTpOptions& opt = {});

/// row_parallel_linear for an op that queued work before it and has not agreed on its own
/// checks yet: `earlier_problem` is this device's message from them ("" when they passed; see
/// check_message in dist/mesh/agree.hpp). The devices agree once on both (the earlier problem
/// first); with an earlier problem this device queues nothing.
DeviceTensor row_parallel_linear_after(const MeshDevice& mesh, meshtest::gpu::Blas& blas,
                                       const DeviceTensor& x, const DeviceTensor& weight,
                                       const DeviceTensor* bias, const GpuTpOptions& opt,
                                       std::string earlier_problem);

}  // namespace meshtest::dist
