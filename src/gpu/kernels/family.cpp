// The GPU kernel families' correctness check and bench (see the header).
#include "src/gpu/kernels/family.hpp"

#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "src/core/error.hpp"
#include "src/gpu/cublas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/kernels/fp8_matmul_kernels.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {

namespace {

using kernels::Config;
using kernels::ConfigBench;
using kernels::Inputs;
using kernels::Timing;

/// Products of more multiply-adds than this are checked on kSampledRows rows.
constexpr double kFullCheckLimit = 0x1p33;
constexpr std::int64_t kSampledRows = 256;

/// Rows `rows` of a 2-D tensor.
Tensor gather_rows(const Tensor& t, const std::vector<std::int64_t>& rows) {
  const std::int64_t cols = t.shape()[1];
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * dtype_size(t.dtype());
  Tensor out(Shape({static_cast<std::int64_t>(rows.size()), cols}), t.dtype());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.bytes() + i * row_bytes,
                t.bytes() + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
  }
  return out;
}

/// The rows of y a configuration is checked on: all, or kSampledRows spread evenly over m.
std::vector<std::int64_t> checked_rows(const Config& c) {
  std::vector<std::int64_t> rows;
  const double work =
      static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  const std::int64_t count = work > kFullCheckLimit ? std::min(kSampledRows, c.m) : c.m;
  for (std::int64_t i = 0; i < count; ++i) rows.push_back(i * c.m / count);
  return rows;
}

/// The inputs of the problem restricted to x's rows `rows` (x's tensors are the first two,
/// as in every fp8 family: codes [m, k] and scales [m, nk]).
Inputs rows_of(const Inputs& in, const std::vector<std::int64_t>& rows) {
  Inputs out = in;
  out.config.m = static_cast<std::int64_t>(rows.size());
  out.tensors[0] = gather_rows(in.tensors[0], rows);
  out.tensors[1] = gather_rows(in.tensors[1], rows);
  return out;
}

/// Times `launch` on `stream`: warm-up runs, then each timed run between two events recorded
/// on the stream; the host waits only after the last run is queued.
Timing time_on_device(std::string name, double flops, const kernels::BenchOptions& opt,
                      const Stream& stream, const std::function<void(cudaStream_t)>& launch) {
  for (int i = 0; i < opt.warmup; ++i) launch(stream.get());
  std::vector<Event> starts(static_cast<std::size_t>(opt.iterations));
  std::vector<Event> stops(static_cast<std::size_t>(opt.iterations));
  for (int i = 0; i < opt.iterations; ++i) {
    starts[static_cast<std::size_t>(i)].record(stream.get());
    launch(stream.get());
    stops[static_cast<std::size_t>(i)].record(stream.get());
  }
  stream.synchronize();
  std::vector<double> ms;
  for (std::size_t i = 0; i < starts.size(); ++i)
    ms.push_back(stops[i].elapsed_ms_since(starts[i]));
  return kernels::summarize_runs(std::move(name), ms, flops);
}

/// The baseline: cuBLAS's bf16 GEMM y [m, n] = a [m, k] · b [n, k]ᵀ (bf16 in and out, f32
/// accumulation), on operands made on the device.
Timing time_cublas_bf16(const Config& c, double flops, const kernels::BenchOptions& opt,
                        const Stream& stream) {
  DeviceTensor a(Shape({c.m, c.k}), DType::bf16, Tensor::Uninitialized{});
  DeviceTensor b(Shape({c.n, c.k}), DType::bf16, Tensor::Uninitialized{});
  DeviceTensor y(Shape({c.m, c.n}), DType::bf16, Tensor::Uninitialized{});
  MESHTEST_CUDA_CHECK(cuda_kernels::launch_fill_bf16(reinterpret_cast<std::uint16_t*>(a.bytes()),
                                                     a.numel(), 1, stream.get()));
  MESHTEST_CUDA_CHECK(cuda_kernels::launch_fill_bf16(reinterpret_cast<std::uint16_t*>(b.bytes()),
                                                     b.numel(), 2, stream.get()));
  const BlasHandle blas;
  MESHTEST_CUBLAS_CHECK(cublasSetStream(blas.get(), stream.get()));
  const float one = 1, zero = 0;
  return time_on_device("cublas bf16", flops, opt, stream, [&](cudaStream_t) {
    MESHTEST_CUBLAS_CHECK(cublasGemmEx(
        blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(c.n), static_cast<int>(c.m),
        static_cast<int>(c.k), &one, b.bytes(), CUDA_R_16BF, static_cast<int>(c.k), a.bytes(),
        CUDA_R_16BF, static_cast<int>(c.k), &zero, y.bytes(), CUDA_R_16BF, static_cast<int>(c.n),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
}

}  // namespace

std::vector<Config> GpuFamily::configs() const {
  std::vector<Config> all = cpu->configs;
  all.insert(all.end(), extra_configs.begin(), extra_configs.end());
  return all;
}

std::vector<std::string> version_names(const GpuFamily& f) {
  std::vector<std::string> names;
  for (const GpuVersion& v : f.versions) names.push_back(v.name);
  return names;
}

std::string gpu_device_line() {
  const int device = current_device();
  cudaDeviceProp p{};
  MESHTEST_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return fmt::format("device: cuda:{} {}, {} SMs, {:.1f} GiB, compute capability {}.{}", device,
                     p.name, p.multiProcessorCount,
                     static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), p.major,
                     p.minor);
}

std::string gpu_unavailable_reason() {
  return device_count() > 0 ? std::string() : fmt::format("no GPU: {}", no_gpu_reason());
}

std::vector<GpuCheck> check_gpu_family(const GpuFamily& f, std::span<const Config> configs) {
  const std::string why = gpu_unavailable_reason();
  MESHTEST_CHECK(why.empty(), "{} runs on a GPU: {}", f.name, why);
  const Stream stream;
  std::vector<GpuCheck> out;
  for (const Config& config : configs) {
    const Inputs in = f.cpu->make_inputs(config);
    const std::vector<std::int64_t> rows = checked_rows(config);
    const bool sampled = static_cast<std::int64_t>(rows.size()) < config.m;
    const Tensor reference = f.cpu->reference(sampled ? rows_of(in, rows) : in);
    const std::string config_name =
        sampled ? fmt::format("{} ({} rows checked)", config.name, rows.size()) : config.name;
    for (const GpuVersion& v : f.versions) {
      GpuCheck g;
      g.check.family = f.name;
      g.check.version = v.name;
      g.check.config = config_name;
      g.check.tolerance = v.tolerance ? v.tolerance(config) : config.tolerance;
      g.config = config.name;
      g.config_tolerance = config.tolerance;
      g.skipped = v.unsupported(config);
      if (!g.skipped.empty()) {
        out.push_back(std::move(g));
        continue;
      }
      try {
        const PreparedRun run = v.prepare(in);
        run.launch(stream.get());
        stream.synchronize();
        const Tensor y = run.output();
        const double tolerance = g.check.tolerance;
        kernels::Check c =
            kernels::measure(reference, sampled ? gather_rows(y, rows) : y, tolerance);
        c.family = f.name;
        c.version = v.name;
        c.config = config_name;
        g.check = std::move(c);
        g.check.tolerance = tolerance;
      } catch (const Error& e) {
        g.error = e.what();
        g.check.pass = false;
      }
      out.push_back(std::move(g));
    }
  }
  return out;
}

bool all_pass(std::span<const GpuCheck> checks) {
  return std::ranges::all_of(checks, [](const GpuCheck& g) {
    return !g.skipped.empty() || (g.error.empty() && g.check.pass);
  });
}

std::string gpu_correctness_report(std::span<const GpuCheck> checks) {
  std::vector<kernels::Check> ran;
  std::string notes;
  for (const GpuCheck& g : checks) {
    if (!g.skipped.empty()) {
      notes += fmt::format("{} {}: skipped: {}\n", g.check.version, g.check.config, g.skipped);
    } else if (!g.error.empty()) {
      notes += fmt::format("{} {}: ERROR: {}\n", g.check.version, g.check.config, g.error);
    } else {
      ran.push_back(g.check);
    }
  }
  std::string out =
      ran.empty() ? std::string("no version ran\n") : kernels::correctness_report(ran);
  // The table's header names the configuration's tolerance; a version checked at its own says so.
  std::vector<std::string> noted;
  for (const GpuCheck& g : checks) {
    if (g.config_tolerance <= 0 || g.check.tolerance == g.config_tolerance ||
        std::ranges::find(noted, g.check.version) != noted.end()) {
      continue;
    }
    noted.push_back(g.check.version);
    out += fmt::format(
        "{}: checked at {:g} x each configuration's tolerance (its accumulation's unit roundoff "
        "over f32's)\n",
        g.check.version, g.check.tolerance / g.config_tolerance);
  }
  if (!notes.empty()) out += "\n" + notes;
  return out;
}

std::vector<ConfigBench> bench_gpu_family(const GpuFamily& f, std::span<const Config> configs,
                                          std::span<const GpuCheck> checks,
                                          const kernels::BenchOptions& opt) {
  const std::string why = gpu_unavailable_reason();
  MESHTEST_CHECK(why.empty(), "{} runs on a GPU: {}", f.name, why);
  const auto passed = [&](const GpuVersion& v, const Config& c) {
    return std::ranges::any_of(checks, [&](const GpuCheck& g) {
      return g.check.version == v.name && g.config == c.name && g.skipped.empty() &&
             g.error.empty() && g.check.pass;
    });
  };
  const Stream stream;
  std::vector<ConfigBench> out;
  for (const Config& c : configs) {
    const Inputs in = f.cpu->make_inputs(c);
    const double flops = f.cpu->flops(c);
    ConfigBench r{.config = c, .versions = {}, .baseline = {}};
    for (const GpuVersion& v : f.versions) {
      if (!passed(v, c)) continue;
      const PreparedRun run = v.prepare(in);
      r.versions.push_back(time_on_device(v.name, flops, opt, stream, run.launch));
    }
    r.baseline = time_cublas_bf16(c, flops, opt, stream);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace meshtest::gpu
