// rope (GPU): gpt-oss's rotary position embedding with YaRN scaling on DeviceTensors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <utility>

#include "src/gpu/device_tensor.hpp"
#include "src/ops/rope.hpp"

namespace meshtest::gpu {

/// The CPU apply_rope (src/ops/rope.hpp) on the GPU, queued on `stream` (of x's device): the
/// half-split rotation of every head vector of token i by table row i, each product and sum
/// rounded apart as on the host, so the result is the CPU op's bits (f32 and bf16).
///   x: [T, ..., d], cos and sin: [T, d/2] of x's dtype  ->  x's shape
/// Errors as the CPU op's (shapes, dtypes), and for another dtype or a device other than x's.
/// The perf record ("apply_rope") is timed on the stream. Asynchronous, as swiglu.
DeviceTensor apply_rope(const DeviceTensor& x, const DeviceTensor& cos, const DeviceTensor& sin,
                        cudaStream_t stream);

/// The CPU rope on the GPU: the YaRN table of positions position_offset .. + T - 1 (rope_table,
/// computed on the host: the CPU's bits), applied to q and k.
///   q: [T, ..., d], k: [T, ..., d] (f32 or bf16, one dtype)  ->  (q rotated, k rotated)
/// The table is kept on each GPU per dtype and parameters, for positions 0 .. a power of two
/// (at least 4096) past the highest asked so far: a call reads its rows in place, so it is
/// asynchronous (the rotations queued on `stream`) and can be captured in a CUDA graph, once
/// the positions are in the table (a capture that needs a longer table is an Error: run the op
/// eagerly at those positions first; the longer table's upload waits for the device's earlier
/// work, as every DeviceTensor copy does). Errors as the CPU op's.
std::pair<DeviceTensor, DeviceTensor> rope(const DeviceTensor& q, const DeviceTensor& k,
                                           const RopeParams& p, cudaStream_t stream,
                                           std::int64_t position_offset = 0);

/// rope with token i at positions[i] (host memory, one per token, each >= 0, in any order)
/// instead of position_offset + i: the rows of several sequences at their own positions in one
/// call (a batch decode step). Token i gets the CPU rope's bits at its position. The table's rows
/// are gathered for the tokens on `stream` (embedding_shard's gather; not capturable in a CUDA
/// graph); the call waits for the rotations before it frees them. Errors as rope's, and for a
/// count of positions other than the tokens' or a negative one (named with its index).
std::pair<DeviceTensor, DeviceTensor> rope_at(const DeviceTensor& q, const DeviceTensor& k,
                                              const RopeParams& p, cudaStream_t stream,
                                              std::span<const std::int64_t> positions);

}  // namespace meshtest::gpu
