// graph: trace mode on a GPU — an op sequence captured once into a CUDA graph and replayed on
// the same buffers, with the eager calls' bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>

#include "src/gpu/capture.hpp"

namespace meshtest::gpu {

/// An op sequence on the current device, captured once and replayed as one CUDA graph:
///
///   gpu::Graph g;
///   DeviceTensor y;
///   g.capture([&] { y = dist::tp_mlp(mesh, blas, x, w); });   // records, computes nothing
///   g.replay(); g.synchronize();                               // y = tp_mlp(x) for the x now
///   ... write new values into x (same buffer) ...; g.replay(); g.synchronize();
///
/// capture() runs `f` with this thread's ops redirected to the graph's stream (stream_for),
/// which records in relaxed mode: the host side of each op runs (checks, agreement between the
/// devices, plans, allocations), its device work is recorded, not run. So:
///  - Waits inside the ops (Blas::synchronize, the collectives' wait for their result) are
///    skipped while capturing: the one stream orders the recorded work as the eager calls'
///    waits did. Anything that needs a device result on the host inside `f` (to_host,
///    from_host, bitwise_equal) is an Error: it could not be replayed.
///  - Buffers: a replay reads and writes the buffers the capture saw. Tensors made inside `f`
///    and freed there (intermediates) are kept by the graph until it is destroyed; the tensors
///    that `f` reads (inputs) or hands out (outputs), the Blas and the mesh (its NCCL
///    communicators and workspaces) must outlive the graph. Update inputs in place.
///  - Collectives: a capture and each replay are collective like the captured calls (every
///    device of the group captures the same sequence and replays it as often).
///  - Order: a replay runs on stream(), not on the streams of the Blas or the mesh: synchronize()
///    it before eager calls that use the same Blas, mesh or buffers (they share workspaces and
///    NCCL communicators).
///  - Perf: the capture is one fused op, "cuda_graph_capture" (the scopes inside record
///    nothing); each replay is one op, "cuda_graph", timed by CUDA events on the stream.
/// A replay gives the eager calls' bits: the same kernels, plans and buffers in the same order
/// (test_gpu_graph checks this against eager calls on fresh inputs, and the fused-op kit's
/// trace mode on GPU ops, dist/testing/gpu_fused.hpp).
/// Errors: a second capture, a capture inside another, replay() before a capture, or a CUDA
/// error while capturing throw meshtest::Error; a capture that throws leaves the graph empty
/// and the thread out of capture mode.
class Graph {
 public:
  /// A graph on the current device, with its own non-blocking stream.
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Records the GPU work that `f` queues (see above).
  void capture(const std::function<void()>& f);
  /// Queues one replay on stream(); asynchronous.
  void replay();
  /// Blocks until the replays queued so far have finished; throws their CUDA error.
  void synchronize() const;
  /// The stream captures record into and replays run on.
  cudaStream_t stream() const;
  /// Whether capture() has succeeded.
  bool captured() const;
  /// The number of nodes (kernels, copies, memsets, NCCL's kernels) of the captured graph.
  std::size_t nodes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtest::gpu
