// capture: which stream this thread's GPU ops queue on while a gpu::Graph (graph.hpp) captures,
// and the buffers freed meanwhile, which the graph keeps.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace meshtest::gpu {

/// The stream that a Graph::capture running on this thread records into; nullptr when none does.
cudaStream_t capturing_stream();

/// `own`, or the capturing stream while this thread captures: meshtest's GPU ops (linear,
/// swiglu, the collectives, DeviceTensor's copies and fills) queue their work on
/// stream_for(their stream), so that a capture records all of it, in program order, on one
/// stream. A kernel of your own inside a capture must do the same.
inline cudaStream_t stream_for(cudaStream_t own) {
  const cudaStream_t c = capturing_stream();
  return c != nullptr ? c : own;
}

class Stream;

/// For DeviceTensor: true when this thread is capturing, and then `p` (a device buffer of
/// `device` being freed; allocated in `stream`'s order, or by cudaMalloc when null) is kept by
/// the capturing graph until it is destroyed.
bool keep_if_capturing(std::byte* p, int device, std::shared_ptr<const Stream> stream);

namespace detail {
/// A buffer a capture keeps.
struct KeptBuffer {
  std::byte* p = nullptr;
  int device = -1;
  std::shared_ptr<const Stream> stream;  ///< its allocation's stream (null: cudaMalloc)
};
using KeptBuffers = std::vector<KeptBuffer>;
/// Graph::capture's: marks this thread as capturing into `stream`, freed buffers going to
/// `kept`; (nullptr, nullptr) ends it.
void set_capture(cudaStream_t stream, KeptBuffers* kept);
}  // namespace detail

}  // namespace meshtest::gpu
