// Checks of sharded GPU ops against a single device: expect_matches_single_device and the
// single-device chunked run (dist/testing/harness/single_device.hpp, fused/chunked.hpp) with an
// op that takes and returns DeviceTensors, against a reference on the CPU or on one GPU.
//
//   TEST_F(MyGpuTest, RowParallel) {   // a fixture deriving from gpu::GpuRankTest binds the GPU
//     const MeshDevice mesh({1, p});
//     expect_gpu_matches_single_device(
//         mesh, {{x, {Shard(1)}}, {w, {Shard(1)}}},
//         [](const std::vector<Tensor>& full) { return ops::linear(full[0], full[1]); },
//         [](const MeshDevice& m, const std::vector<DeviceTensor>& local) {
//           return dist::all_reduce(m, my_gemm(local[0], local[1]));   // the op under test
//         },
//         kReplicated, {.model = ErrorModel{.dtype = DType::f32, .terms = k}});
//   }
//
// The shards are copied to each rank's GPU (the current device: bind_rank_to_gpu), the op runs
// there, and its output comes back to the host for the same gather and comparison as a host op;
// a reference on one GPU runs on device 0's GPU with the full inputs. Header only: a test links
// meshtest::dist_gpu and meshtest::gtest_main (and meshtest::fused_kit for the chunked run).
#pragma once

#include <functional>
#include <vector>

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/testing/fused/chunked.hpp"
#include "dist/testing/harness/single_device.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::dist::testing {

/// A sharded op on GPU ranks: this device's shards of the inputs on its GPU, in order; returns
/// this device's shard of the output on its GPU.
using GpuShardedFn =
    std::function<DeviceTensor(const MeshDevice& mesh, const std::vector<DeviceTensor>& local)>;
/// A reference on one GPU: the full inputs on the GPU, in order; returns the full output there.
using GpuReferenceFn = std::function<DeviceTensor(const std::vector<DeviceTensor>& full)>;

/// Copies of host tensors on the current GPU, in order.
inline std::vector<DeviceTensor> to_device(const std::vector<Tensor>& host) {
  std::vector<DeviceTensor> out;
  out.reserve(host.size());
  for (const Tensor& t : host) out.push_back(DeviceTensor::from_host(t));
  return out;
}

/// The GPU op as a host op: its inputs copied to the current GPU, its output copied back.
inline ShardedFn on_gpu(GpuShardedFn sharded) {
  return [sharded = std::move(sharded)](const MeshDevice& mesh, const std::vector<Tensor>& local) {
    return sharded(mesh, to_device(local)).to_host();
  };
}

/// The one-GPU reference as a host reference (run where the host reference would run: device 0).
inline ReferenceFn on_one_gpu(GpuReferenceFn reference) {
  return [reference = std::move(reference)](const std::vector<Tensor>& full) {
    return reference(to_device(full)).to_host();
  };
}

/// expect_matches_single_device with the sharded op on every rank's GPU and the reference on
/// the CPU (see single_device.hpp: collective, device 0 compares and records the failure).
inline Comparison expect_gpu_matches_single_device(const MeshDevice& mesh,
                                                   const std::vector<ShardedInput>& inputs,
                                                   const ReferenceFn& reference,
                                                   GpuShardedFn sharded,
                                                   const Placements& output = kReplicated,
                                                   const MatchOptions& options = {}) {
  return expect_matches_single_device(mesh, inputs, reference, on_gpu(std::move(sharded)), output,
                                      options);
}

/// The same with the reference on device 0's GPU.
inline Comparison expect_gpu_matches_single_device(const MeshDevice& mesh,
                                                   const std::vector<ShardedInput>& inputs,
                                                   GpuReferenceFn reference, GpuShardedFn sharded,
                                                   const Placements& output = kReplicated,
                                                   const MatchOptions& options = {}) {
  return expect_matches_single_device(mesh, inputs, on_one_gpu(std::move(reference)),
                                      on_gpu(std::move(sharded)), output, options);
}

/// The single-device chunked run (fused/chunked.hpp) of a GPU op: device 0's chunks of a
/// `shape` mesh's inputs on this rank's GPU, on a one-device mesh, against the reference on
/// the CPU. Not collective (the rank running the chunk calls it).
inline Comparison expect_gpu_chunk_matches(MeshShape shape, const std::vector<MeshInput>& inputs,
                                           const ReferenceFn& reference, GpuShardedFn sharded,
                                           const MatchOptions& options = {}) {
  return expect_chunk_matches(shape, inputs, reference, on_gpu(std::move(sharded)), options);
}

}  // namespace meshtest::dist::testing
