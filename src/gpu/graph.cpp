// graph: the capture (a relaxed stream capture with this thread's ops redirected to it, the
// buffers freed inside kept), the instantiated graph and its replays.
#include "src/gpu/graph.hpp"

#include <utility>
#include <vector>

#include "src/core/error.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {

struct Graph::Impl {
  Stream stream;
  int device = current_device();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::size_t nodes = 0;
  detail::KeptBuffers kept;  // freed inside the capture

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    const DeviceGuard on(device);
    (void)cudaStreamSynchronize(stream.get());  // replays may still use the buffers
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    free_kept();
  }

  void free_kept() noexcept {
    for (const detail::KeptBuffer& b : kept) {
      const DeviceGuard on(b.device);
      (void)(b.stream != nullptr ? cudaFreeAsync(b.p, b.stream->get()) : cudaFree(b.p));
    }
    kept.clear();
  }
};

namespace {

/// Ends the stream capture of `impl` (after `f` returned or threw); the recorded graph, or
/// nullptr with the error when the capture went wrong.
cudaGraph_t end_capture(Graph::Impl& impl, cudaError_t& err) {
  detail::set_capture(nullptr, nullptr);
  cudaGraph_t g = nullptr;
  err = cudaStreamEndCapture(impl.stream.get(), &g);
  if (err != cudaSuccess && g != nullptr) (void)cudaGraphDestroy(g), g = nullptr;
  return g;
}

}  // namespace

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;

cudaStream_t Graph::stream() const { return impl_->stream.get(); }
bool Graph::captured() const { return impl_->exec != nullptr; }
std::size_t Graph::nodes() const { return impl_->nodes; }

void Graph::capture(const std::function<void()>& f) {
  MESHTEST_CHECK(capturing_stream() == nullptr,
                 "gpu graph: capture inside another capture on this thread (capture the whole "
                 "sequence once)");
  MESHTEST_CHECK(!captured(),
                 "gpu graph: already captured ({} nodes); make a new Graph to "
                 "capture another sequence",
                 impl_->nodes);
  Impl& impl = *impl_;
  const DeviceGuard on(impl.device);
  const perf::OpScope scope("cuda_graph_capture", perf::OpScope::fused);
  MESHTEST_CUDA_CHECK(cudaStreamBeginCapture(impl.stream.get(), cudaStreamCaptureModeRelaxed));
  detail::set_capture(impl.stream.get(), &impl.kept);
  cudaError_t err = cudaSuccess;
  try {
    f();
  } catch (...) {
    (void)end_capture(impl, err);
    (void)cudaGetLastError();
    (void)cudaStreamSynchronize(impl.stream.get());
    impl.free_kept();
    throw;
  }
  impl.graph = end_capture(impl, err);
  if (err != cudaSuccess) {
    (void)cudaStreamSynchronize(impl.stream.get());
    impl.free_kept();
    fail(
        "gpu graph: the capture failed with {} ({}): something inside it waited for the "
        "device or queued work on another stream that joined the capture; only work queued "
        "on gpu::stream_for(...) can be captured",
        cudaGetErrorName(err), cudaGetErrorString(err));
  }
  const cudaError_t inst = cudaGraphInstantiate(&impl.exec, impl.graph, 0);
  if (inst != cudaSuccess) {
    (void)cudaGraphDestroy(impl.graph);
    impl.graph = nullptr, impl.exec = nullptr;
    cuda_fail(inst, "cudaGraphInstantiate(&impl.exec, impl.graph, 0)", __FILE__, __LINE__);
  }
  MESHTEST_CUDA_CHECK(cudaGraphGetNodes(impl.graph, nullptr, &impl.nodes));
}

void Graph::replay() {
  MESHTEST_CHECK(captured(),
                 "gpu graph: replay() before a capture (capture() records the "
                 "sequence first)");
  MESHTEST_CHECK(capturing_stream() == nullptr, "gpu graph: replay() inside a capture");
  const DeviceGuard on(impl_->device);
  perf::OpScope scope("cuda_graph");
  scope.attr("nodes", impl_->nodes);
  time_on_stream(scope, impl_->stream.get());
  MESHTEST_CUDA_CHECK(cudaGraphLaunch(impl_->exec, impl_->stream.get()));
}

void Graph::synchronize() const {
  const DeviceGuard on(impl_->device);
  impl_->stream.synchronize();
}

}  // namespace meshtest::gpu
