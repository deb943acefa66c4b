// capture: this thread's capture state.
#include "src/gpu/capture.hpp"

namespace meshtest::gpu {
namespace {

thread_local cudaStream_t t_stream = nullptr;
thread_local detail::KeptBuffers* t_kept = nullptr;

}  // namespace

cudaStream_t capturing_stream() { return t_stream; }

bool keep_if_capturing(std::byte* p, int device) {
  if (t_kept == nullptr) return false;
  t_kept->emplace_back(p, device);
  return true;
}

void detail::set_capture(cudaStream_t stream, KeptBuffers* kept) {
  t_stream = stream;
  t_kept = kept;
}

}  // namespace meshtest::gpu
