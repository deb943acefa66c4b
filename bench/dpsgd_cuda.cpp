// dpsgd_cuda: one DP step of a mode on a GPU model or under FSDP on GPU ranks, timed on the host
// (the model's compute and the FSDP step are complete when they return), its peak from the
// device tensors' own high-water mark.
#include "bench/dpsgd_cuda.hpp"

#include <mpi.h>

#include <chrono>
#include <optional>
#include <string>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/gpu/parallel/fsdp_dp.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/dp_model.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::bench {

std::string bind_dp_cuda() {
  std::string problem = dist::gpu::gpu_binding_problem();
  if (problem.empty()) (void)dist::gpu::bind_rank_to_gpu();
  return problem;
}

CudaDpSample measure_dp_cuda(const dist::MeshDevice& mesh, const dp::Sequential& model,
                             const std::string& mode, const Tensor& x, const Tensor& y,
                             double clip) {
  // One Blas for the process (its plans cached across steps), never destroyed: its stream and
  // handle would otherwise outlive the CUDA context at exit.
  static gpu::Blas* const blas = new gpu::Blas;
  const int device = blas->device();
  std::optional<gpu::dp::Model> gpu_model;
  std::optional<dist::GpuFsdpDpSgd> fsdp;
  if (mesh.size() == 1) {
    gpu_model.emplace(*blas, model);
  } else {
    fsdp.emplace(
        mesh, *blas, model,
        dp::DpSgdOptions{.mode = mode, .dp = {.clip = clip}, .noise = {}, .optimizer = {}});
  }
  const gpu::DeviceTensor dx = gpu::DeviceTensor::from_host(x);
  const gpu::DeviceTensor dy = gpu::DeviceTensor::from_host(y);
  blas->synchronize();
  gpu::reset_peak_memory(device);
  MESHTEST_MPI(MPI_Barrier(mesh.comm()));
  const auto t0 = std::chrono::steady_clock::now();
  if (gpu_model) {
    (void)gpu_model->compute(dx, dy, mode, {.clip = clip});
  } else {
    (void)fsdp->step(dx, dy);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {.seconds = seconds, .peak = static_cast<std::int64_t>(gpu::peak_memory(device))};
}

}  // namespace meshtest::bench
