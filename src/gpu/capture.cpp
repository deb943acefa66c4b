// capture: this thread's capture state.
#include "src/gpu/capture.hpp"

#include <utility>

namespace meshtest::gpu {
namespace {

thread_local cudaStream_t t_stream = nullptr;
thread_local detail::KeptBuffers* t_kept = nullptr;

}  // namespace

cudaStream_t capturing_stream() { return t_stream; }

bool keep_if_capturing(std::byte* p, int device, std::shared_ptr<const Stream> stream) {
  if (t_kept == nullptr) return false;
  t_kept->push_back({.p = p, .device = device, .stream = std::move(stream)});
  return true;
}

void detail::set_capture(cudaStream_t stream, KeptBuffers* kept) {
  t_stream = stream;
  t_kept = kept;
}

}  // namespace meshtest::gpu
