// gpu_fused: a fused op on GPU ranks as the fused-op kit's FusedFn (fused/fused_op.hpp), whose
// trace mode is a CUDA graph (src/gpu/graph.hpp).
//
//   std::vector<DeviceTensor> mlp_fused(const FusedSetup& s, const MeshDevice& mesh,
//                                       const std::vector<DeviceTensor>& local) { ... }
//   ... .fused = testing::on_gpu_fused(mlp_fused) ...        // or FusedRunner(mesh, fn, s, local)
//
// Eager calls (cache_off, cache_on): this device's pieces are copied to its GPU, the op runs
// there and its outputs are copied back. Under the kit's trace capture (perf::Trace::active()):
// the op runs eagerly once, which gives the captured outputs, then is captured into a gpu::Graph
// on device copies of the inputs, and one trace step, "cuda_graph", is added whose run copies
// the trace's inputs to the GPU, replays the graph (collective, like the op) and copies the
// outputs back into the kept ones. The kit then overwrites the kept outputs, replays and checks
// the replay against the eager call bit for bit, and its trace-mode e2e and device perf time the
// replays. The capture is one op, "cuda_graph" (its inner scopes record nothing), matching the
// one step, so the kit takes it as a real replay; in the trace-mode report the op is
// "cuda_graph", host-timed from the copy of the inputs to the copy of the outputs (the
// graph's own device time: gpu::Graph::replay under the profiler). A graph in which a
// collective ran (perf::ccl_scopes_opened) is a step of type ccl: its devices wait for each
// other inside it, and the kit's single-device run skips it as it skips a CCL (device 0's chunk
// alone would not be device 0's computation).
// Header only: a test links meshtest::fused_kit and meshtest::dist_gpu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dist/gpu/ccl/nccl_comm.hpp"
#include "dist/testing/fused/fused_op.hpp"
#include "dist/testing/gpu_checks.hpp"
#include "src/gpu/graph.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::dist::testing {

/// The fused op on this device's GPU: its pieces of the inputs there -> its pieces of the
/// outputs there, complete when it returns (as meshtest's GPU ops leave them).
using GpuFusedFn = std::function<std::vector<DeviceTensor>(
    const FusedSetup& s, const MeshDevice& mesh, const std::vector<DeviceTensor>& local)>;

namespace detail {

/// A captured graph with its device inputs and outputs and the host buffers of its trace step.
struct GpuGraphStep {
  meshtest::gpu::Graph graph;
  std::vector<DeviceTensor> in, out;
  std::vector<const std::byte*> host_in;
  std::vector<std::byte*> host_out;
  ncclComm_t comm = nullptr;  // the mesh's, whose errors and abort end the wait

  void run() {
    for (std::size_t i = 0; i < in.size(); ++i) {
      MESHTEST_CUDA_CHECK(
          cudaMemcpy(in[i].bytes(), host_in[i], in[i].nbytes(), cudaMemcpyHostToDevice));
    }
    graph.replay();
    gpu::wait_stream(graph.stream(), comm, "the replay of a cuda_graph");
    for (std::size_t i = 0; i < out.size(); ++i) {
      MESHTEST_CUDA_CHECK(
          cudaMemcpy(host_out[i], out[i].bytes(), out[i].nbytes(), cudaMemcpyDeviceToHost));
    }
  }
};

/// Copies of device tensors on the host, in order.
inline std::vector<Tensor> to_host(const std::vector<DeviceTensor>& device) {
  std::vector<Tensor> out;
  out.reserve(device.size());
  for (const DeviceTensor& t : device) out.push_back(t.to_host());
  return out;
}

}  // namespace detail

/// The GPU op as the kit's fused function (see above).
inline FusedFn on_gpu_fused(GpuFusedFn fused) {
  return [fused = std::move(fused)](const FusedSetup& s, const MeshDevice& mesh,
                                    const std::vector<Tensor>& local) {
    perf::Trace* trace = perf::Trace::active();
    if (trace == nullptr) return detail::to_host(fused(s, mesh, to_device(local)));
    const perf::OpScope scope("cuda_graph", perf::OpScope::fused);
    std::vector<Tensor> eager;
    auto step = std::make_shared<detail::GpuGraphStep>();
    bool collective = false;
    {
      const perf::Trace::Paused paused;  // the collectives inside take device tensors
      step->comm = gpu::MeshNccl::of(mesh).group(kAllAxes).comm();
      step->in = to_device(local);
      const std::uint64_t ccls = perf::ccl_scopes_opened();
      eager = detail::to_host(fused(s, mesh, step->in));
      collective = perf::ccl_scopes_opened() != ccls;
      step->graph.capture([&] { step->out = fused(s, mesh, step->in); });
    }
    std::vector<const Tensor*> ins, outs;
    for (const Tensor& t : local) ins.push_back(&t), step->host_in.push_back(t.bytes());
    for (Tensor& t : eager) outs.push_back(&t), step->host_out.push_back(t.bytes());
    trace->add_step("cuda_graph", collective ? perf::OpType::ccl : perf::OpType::compute, ins, outs,
                    [step] { step->run(); });
    return eager;
  };
}

}  // namespace meshtest::dist::testing
