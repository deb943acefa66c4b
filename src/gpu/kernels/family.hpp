// GPU kernel families: versions of a kernel family (src/kernels/family.hpp) that run on one GPU.
// A GPU version is prepared once per configuration (operands uploaded, handles and workspaces
// made, layouts converted: outside any timed region), then its run is queued on a stream as
// often as the check or the bench wants. The family's reference, inputs, configurations and
// error measure are the CPU family's; the bench times each run with CUDA events on
// device-resident operands beside a cuBLAS bf16 GEMM of the same shape (bf16 in, f32
// accumulation, bf16 out), timed in the same run.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/core/tensor.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/kernels/bench.hpp"
#include "src/kernels/family.hpp"

namespace meshtest::gpu {

/// A version prepared for one configuration on the current device.
struct PreparedRun {
  /// Queues one run on `stream` (asynchronous; the output is complete when the stream is).
  std::function<void(cudaStream_t)> launch;
  /// The last run's output, f32 [m, n] on the host (after the stream is synchronized).
  std::function<Tensor()> output;
  /// The same output where the run wrote it, on the device (no copy): read it once the stream
  /// is synchronized; the next run overwrites it, and it lives as long as this PreparedRun or
  /// a copy of it. For device code (the GPU collectives) that takes the result as it is.
  std::function<const DeviceTensor&()> device_output;
};

struct GpuVersion {
  std::string name;         ///< "gpu v1"
  std::string description;  ///< one line
  /// Why the version cannot run `config` on the current device ("" when it can): the check
  /// and the bench skip it there and say why; prepare() throws Error with the same reason.
  std::function<std::string(const kernels::Config&)> unsupported;
  std::function<PreparedRun(const kernels::Inputs&)> prepare;
  /// The version's tolerance on `config` where it is not the configuration's (e.g. tensor
  /// cores that accumulate in fewer bits than f32); empty: config.tolerance.
  std::function<double(const kernels::Config&)> tolerance;
};

struct GpuFamily {
  std::string name;
  const kernels::Family* cpu = nullptr;  ///< inputs, reference, configurations, flops
  std::vector<GpuVersion> versions;
  /// Configurations the GPU family adds to the CPU family's full suite (large squares).
  std::vector<kernels::Config> extra_configs;

  /// The full suite: the CPU family's configurations and the extra ones.
  std::vector<kernels::Config> configs() const;
  const std::vector<kernels::Config>& quick_configs() const { return cpu->quick_configs; }
};

/// Why this process cannot run GPU versions ("" when it can): no GPU, with the runtime's reason.
std::string gpu_unavailable_reason();

/// "device: cuda:<i> <name>, <n> SMs, <x> GiB, compute capability <major>.<minor>" of the
/// current device: the GPU families' report names the device it timed.
std::string gpu_device_line();

/// The outcome of checking one version on one configuration.
struct GpuCheck {
  kernels::Check check;  ///< names and tolerance only when skipped or failed with an error
  std::string config;    ///< the configuration's name (check.config may add "(256 rows checked)")
  double config_tolerance = 0;  ///< the configuration's own tolerance
  std::string skipped;  ///< why the version does not run this configuration ("" when it ran)
  std::string error;    ///< the Error it threw ("" when it ran to the end)
};

/// Every version of f on every configuration, against the CPU family's f64 reference. Large
/// configurations (m n k above 2^33) are checked on 256 rows spread over y: the reference is
/// computed for those rows only. Needs a GPU (the current device).
std::vector<GpuCheck> check_gpu_family(const GpuFamily& f,
                                       std::span<const kernels::Config> configs);

/// The correctness report: the CPU family's table for the versions that ran, then a line per
/// skipped configuration and per error.
std::string gpu_correctness_report(std::span<const GpuCheck> checks);
/// True when no version failed or threw (skips are not failures).
bool all_pass(std::span<const GpuCheck> checks);

/// Times the versions that passed `checks` on each configuration (a version that failed or was
/// skipped there is not timed there), and the cuBLAS bf16 GEMM baseline, with CUDA events: the
/// operands are prepared first, then opt.warmup untimed runs, then opt.iterations runs each
/// between two events; no host work inside the measured region.
std::vector<kernels::ConfigBench> bench_gpu_family(const GpuFamily& f,
                                                   std::span<const kernels::Config> configs,
                                                   std::span<const GpuCheck> checks,
                                                   const kernels::BenchOptions& opt);

/// The names of f's versions, in order.
std::vector<std::string> version_names(const GpuFamily& f);

}  // namespace meshtest::gpu
