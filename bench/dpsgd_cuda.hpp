// dpsgd_cuda: meshtest-bench dpsgd --device cuda (bench/bench_dpsgd.cpp): one gradient
// computation of a DP mode on a GPU model (src/gpu/dp_model.hpp) on one GPU, or one FSDP step on
// GPU ranks (dist/gpu/parallel/fsdp_dp.hpp), timed and with its peak GPU memory. Built with the
// GPU side.
#pragma once

#include <cstdint>
#include <string>

#include "dist/mesh/mesh_device.hpp"
#include "src/core/tensor.hpp"
#include "src/dp/sequential.hpp"

namespace meshtest::bench {

/// Collective over MPI_COMM_WORLD: binds every rank to a GPU of its own and returns "", or
/// returns why it cannot (the same on every rank: no GPU, fewer GPUs than ranks).
std::string bind_dp_cuda();

/// One measured step on the current GPU.
struct CudaDpSample {
  double seconds = 0;     ///< forward, norms, clipping and the clipped sum, complete
  std::int64_t peak = 0;  ///< bytes: the peak of meshtest's GPU tensors (weights and data included)
};

/// Copies `model`, x and y to the GPU (not timed), then times `mode`'s gradient computation
/// (gpu::dp::Model::compute) with its peak of gpu::peak_memory. On a mesh of several devices
/// (collective): this device's shards of the model (GpuFsdpDpSgd, not timed), then one FSDP step
/// on its samples x, y (the gathers, the passes, the reduce_scatters and the SGD update), timed
/// from a barrier; this device's time and peak (the caller takes the maxima).
CudaDpSample measure_dp_cuda(const dist::MeshDevice& mesh, const dp::Sequential& model,
                             const std::string& mode, const Tensor& x, const Tensor& y,
                             double clip);

}  // namespace meshtest::bench
