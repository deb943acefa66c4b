// tp_mlp (GPU): a dense gpt-oss MLP (linear, SwiGLU, linear) with tensor parallelism on this
// rank's GPU: mlp1 column-parallel, swiglu local, mlp2 row-parallel (tp_linear.hpp).
#pragma once

#include <cstdint>

#include "dist/gpu/parallel/tp_linear.hpp"
#include "src/core/tensor.hpp"
#include "src/ops/activations.hpp"

namespace meshtest::dist {

/// One device's shard of a dense MLP y = mlp2(swiglu(mlp1(x))) with I intermediate units over
/// p devices (I a multiple of p), device i holding units [i I/p, (i+1) I/p):
///   w1 [2I/p, hidden]: mlp1's rows [2 i I/p, 2 (i+1) I/p) — whole glu/linear pairs, since
///      mlp1's rows interleave them (row 2u is unit u's glu, 2u + 1 its linear); b1 [2I/p]
///   w2 [hidden, I/p]: mlp2's columns of those units; b2 [hidden] whole, added once
/// the layout of tp_shard.hpp's mlp1/mlp2 for one expert.
struct TpMlpShard {
  DeviceTensor w1, b1, w2, b2;
};

/// Device `index` of `size`'s shard of the full host weights w1 [2I, hidden], b1 [2I],
/// w2 [hidden, I], b2 [hidden], copied to the current device. Local. An Error names the shape
/// that does not fit or I and size when size does not divide I.
TpMlpShard shard_mlp(const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                     int size, int index);

struct TpMlpOptions {
  GpuTpOptions tp = {};
  double alpha = kSwigluAlpha;  ///< swiglu's alpha and limit (src/ops/activations.hpp)
  double limit = kSwigluLimit;
};

/// y = row_parallel(swiglu(column_parallel(x, w1, b1)), w2, b2): the single-device
/// linear(swiglu(linear(x, W1, b1)), W2, b2) with the units split over opt.tp.axis.
///   x: [..., hidden] (the same on every device of the axis)  ->  [..., hidden] (likewise)
/// Collective over the axis: bad input on any device (shapes, dtypes, devices, swiglu's
/// alpha/limit) is the same Error on every device, before the all_reduce. A device whose own
/// checks pass queues mlp1, swiglu and mlp2 before the devices agree (one agreement, while the
/// GPU works); a device whose checks fail queues nothing.
DeviceTensor tp_mlp(const MeshDevice& mesh, meshtest::gpu::Blas& blas, const DeviceTensor& x,
                    const TpMlpShard& w, const TpMlpOptions& opt = {});

}  // namespace meshtest::dist
