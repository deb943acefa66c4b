// The fp8 matmul's GPU versions (see the header).
#include "src/gpu/kernels/fp8_matmul.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/core/error.hpp"
#include "src/gpu/cublas.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/kernels/fp8_matmul_kernels.hpp"
#include "src/gpu/runtime.hpp"
#include "src/kernels/fp8_matmul.hpp"

namespace meshtest::gpu {

namespace {

using kernels::Config;
using kernels::Inputs;

/// The operands on the current device and the output y f32 [m, n].
struct DeviceOperands {
  kernels::Fp8MatmulOperands::Dims dims;
  DeviceTensor xq, xs, wq, ws, y;

  explicit DeviceOperands(const Inputs& in) {
    const kernels::Fp8MatmulOperands o = kernels::fp8_matmul_operands(in);
    dims = o.dims;
    const auto [m, n, k, b, nk] = dims;
    MESHTEST_CHECK(b > 0 && b % 16 == 0,
                   "fp8_matmul_gpu: block {} must be a positive multiple of 16", b);
    MESHTEST_CHECK(nk == (k + b - 1) / b && o.x.scales.shape() == Shape({m, nk}) &&
                       o.w.scales.shape() == Shape({(n + b - 1) / b, nk}),
                   "fp8_matmul_gpu: scales xs {} and ws {} do not match x [{}, {}] and w [{}, {}] "
                   "in blocks of {}",
                   o.x.scales.shape(), o.w.scales.shape(), m, k, n, k, b);
    MESHTEST_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
                   "fp8_matmul_gpu: m {} n {} k {} exceed cuBLAS's int dimensions", m, n, k);
    xq = DeviceTensor::from_host(o.x.codes);
    xs = DeviceTensor::from_host(o.x.scales);
    wq = DeviceTensor::from_host(o.w.codes);
    ws = DeviceTensor::from_host(o.w.scales);
    y = DeviceTensor(Shape({m, n}), DType::f32, Tensor::Uninitialized{});
  }

  cuda_kernels::Fp8Operands view() const {
    return {.xq = xq.data<std::uint8_t>(),
            .xs = xs.data<float>(),
            .wq = wq.data<std::uint8_t>(),
            .ws = ws.data<float>(),
            .m = dims.m,
            .n = dims.n,
            .k = dims.k,
            .block = dims.block};
  }
};

/// A PreparedRun over state S (which holds a DeviceOperands `op`): `launch` queues the run, the
/// outputs read `op.y`.
template <class S>
PreparedRun prepared(std::shared_ptr<S> s, void (*launch)(S&, cudaStream_t)) {
  return {.launch = [s, launch](cudaStream_t stream) { launch(*s, stream); },
          .output = [s] { return s->op.y.to_host(); },
          .device_output = [s]() -> const DeviceTensor& { return s->op.y; }};
}

// ---- gpu v1: dequantize, then cuBLAS f32 ----

struct V1 {
  DeviceOperands op;
  DeviceTensor x, w;  // f32 [m, k], [n, k]
  BlasHandle blas;
  explicit V1(const Inputs& in)
      : op(in),
        x(Shape({op.dims.m, op.dims.k}), DType::f32, Tensor::Uninitialized{}),
        w(Shape({op.dims.n, op.dims.k}), DType::f32, Tensor::Uninitialized{}) {}
};

void launch_v1(V1& s, cudaStream_t stream) {
  const auto [m, n, k, b, nk] = s.op.dims;
  if (m == 0 || n == 0) return;
  MESHTEST_CUDA_CHECK(cuda_kernels::launch_dequantize(
      s.op.xq.data<std::uint8_t>(), s.op.xs.data<float>(), m, k, 1, b, s.x.data<float>(), stream));
  MESHTEST_CUDA_CHECK(cuda_kernels::launch_dequantize(
      s.op.wq.data<std::uint8_t>(), s.op.ws.data<float>(), n, k, b, b, s.w.data<float>(), stream));
  // Row-major y [m, n] = x · wᵀ is column-major yᵀ [n, m] = (w as k x n)ᵀ · (x as k x m).
  const float one = 1, zero = 0;
  MESHTEST_CUBLAS_CHECK(cublasSetStream(s.blas.get(), stream));
  MESHTEST_CUBLAS_CHECK(
      cublasGemmEx(s.blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), &one, s.w.data<float>(), CUDA_R_32F, static_cast<int>(k),
                   s.x.data<float>(), CUDA_R_32F, static_cast<int>(k), &zero, s.op.y.data<float>(),
                   CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---- gpu v2: the tiled kernel ----

struct V2 {
  DeviceOperands op;
  explicit V2(const Inputs& in) : op(in) {}
};

void launch_v2(V2& s, cudaStream_t stream) {
  MESHTEST_CUDA_CHECK(
      cuda_kernels::launch_fp8_matmul_tiled(s.op.view(), s.op.y.data<float>(), stream));
}

// ---- gpu v3: cuBLASLt fp8 with 128 x 128 and 1 x 128 block scaling ----

constexpr std::int64_t kLtBlock = 128;
constexpr std::size_t kLtWorkspaceBytes = 32u << 20;

std::string v3_unsupported(const Config& c) {
  if (c.block != kLtBlock) {
    return fmt::format("block {}: cuBLASLt's fp8 block scaling takes b = 128", c.block);
  }
  if (c.m <= 0 || c.n <= 0 || c.k <= 0) return "an empty product";
  if (c.k % kLtBlock != 0) {
    return fmt::format(
        "k {} is not a multiple of 128 (cuBLASLt's fp8 block scaling takes whole K blocks)", c.k);
  }
  if (c.n % 16 != 0) {
    return fmt::format(
        "n {} is not a multiple of 16 (cuBLASLt's fp8 GEMM: w's and y's rows "
        "16-byte aligned, n a multiple of 16)",
        c.n);
  }
  if (c.m % 8 != 0) return fmt::format("m {} is not a multiple of 8 (cuBLASLt's fp8 GEMM)", c.m);
  const std::size_t lt_version = cublasLtGetVersion();
  if (lt_version < 120900) {
    return fmt::format("cuBLASLt {} predates block scaling (12.9 and later)", lt_version);
  }
  const int device = current_device();
  int major = 0, minor = 0;
  MESHTEST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MESHTEST_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9) {
    return fmt::format(
        "cuBLASLt's 128 x 128 / 1 x 128 fp8 block scaling runs on sm_90 (Hopper) "
        "only; cuda:{} is sm_{}{}",
        device, major, minor);
  }
  return "";
}

template <class T, cublasStatus_t (*Destroy)(T)>
struct LtDeleter {
  void operator()(T p) const noexcept { Destroy(p); }
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                   LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                               LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using Preference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                    LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

Layout layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  MESHTEST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows),
                                                   static_cast<std::uint64_t>(cols), ld));
  return Layout(l);
}

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  MESHTEST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}

/// w's scales [nb, nk] row-major as cuBLASLt's 128 x 128 layout reads them: the K-block index
/// contiguous, each N block's row padded to a multiple of 4 (16 bytes).
Tensor lt_block_scales(const Tensor& ws) {
  const std::int64_t nb = ws.shape()[0], nk = ws.shape()[1], pitch = (nk + 3) / 4 * 4;
  Tensor out(Shape({nb, pitch}), DType::f32);
  for (std::int64_t r = 0; r < nb; ++r) {
    for (std::int64_t c = 0; c < nk; ++c)
      out.data<float>()[r * pitch + c] = ws.data<float>()[r * nk + c];
  }
  return out;
}

struct V3 {
  DeviceOperands op;
  DeviceTensor w_scales;  // [nb, round_up(nk, 4)]
  DeviceTensor x_scales;  // [nk, m]: xs transposed in each run
  DeviceTensor workspace;
  LtHandle lt;
  MatmulDesc desc;
  Layout a, b, d;
  cublasLtMatmulAlgo_t algo{};
  float alpha = 1, beta = 0;

  explicit V3(const Inputs& in) : op(in) {
    const auto [m, n, k, bl, nk] = op.dims;
    w_scales = DeviceTensor::from_host(lt_block_scales(op.ws.to_host()));
    x_scales = DeviceTensor(Shape({nk, m}), DType::f32, Tensor::Uninitialized{});
    workspace = DeviceTensor(Shape({static_cast<std::int64_t>(kLtWorkspaceBytes)}), DType::u8,
                             Tensor::Uninitialized{});
    cublasLtMatmulDesc_t raw = nullptr;
    MESHTEST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    desc.reset(raw);
    // Column-major yᵀ [n, m] = Aᵀ · B with A = w as k x n (transposed: the TN form fp8 needs)
    // and B = x as k x m; A carries the 128 x 128 blocks, B the 1 x 128 groups.
    set(raw, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(raw, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set(raw, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
        static_cast<std::int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F));
    set(raw, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
        static_cast<std::int32_t>(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F));
    set(raw, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scales.bytes()));
    set(raw, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(x_scales.bytes()));
    a = layout(CUDA_R_8F_E4M3, k, n, k);
    b = layout(CUDA_R_8F_E4M3, k, m, k);
    d = layout(CUDA_R_32F, n, m, n);
    cublasLtMatmulPreference_t pref_raw = nullptr;
    MESHTEST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
    const Preference pref(pref_raw);
    const std::uint64_t bytes = kLtWorkspaceBytes;
    MESHTEST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        lt.get(), raw, a.get(), b.get(), d.get(), d.get(), pref_raw, 1, &result, &found);
    MESHTEST_CHECK(
        status == CUBLAS_STATUS_SUCCESS && found > 0,
        "gpu v3: cuBLASLt {} offers no fp8 GEMM with 128 x 128 block scales on w and "
        "1 x 128 group scales on x, f32 out, for m {} n {} k {} ({}; "
        "CUBLASLT_LOG_LEVEL=5 shows why)",
        cublasLtGetVersion(), m, n, k,
        status == CUBLAS_STATUS_SUCCESS ? "no algorithm found" : cublasGetStatusName(status));
    algo = result.algo;
  }
};

void launch_v3(V3& s, cudaStream_t stream) {
  const auto [m, n, k, b, nk] = s.op.dims;
  MESHTEST_CUDA_CHECK(cuda_kernels::launch_transpose_scales(s.op.xs.data<float>(), m, nk,
                                                            s.x_scales.data<float>(), stream));
  float* y = s.op.y.data<float>();
  MESHTEST_CUBLAS_CHECK(cublasLtMatmul(s.lt.get(), s.desc.get(), &s.alpha, s.op.wq.bytes(),
                                       s.a.get(), s.op.xq.bytes(), s.b.get(), &s.beta, y, s.d.get(),
                                       y, s.d.get(), &s.algo, s.workspace.bytes(),
                                       kLtWorkspaceBytes, stream));
}

PreparedRun prepare_v3(const Inputs& in) {
  const std::string why = v3_unsupported(in.config);
  MESHTEST_CHECK(why.empty(), "gpu v3 cannot run '{}' (m {} n {} k {} block {}): {}",
                 in.config.name, in.config.m, in.config.n, in.config.k, in.config.block, why);
  return prepared(std::make_shared<V3>(in), &launch_v3);
}

/// The version's tolerance when it accumulates with unit roundoff `u` instead of f32's 2^-24:
/// the configuration's bound scales with the accumulation's roundoff (src/check/tolerance.hpp).
std::function<double(const Config&)> accumulating_with(double u) {
  return [u](const Config& c) { return c.tolerance * u / 0x1p-24; };
}

}  // namespace

GpuFamily fp8_matmul_gpu_family() {
  const auto runs_everything = [](const Config&) { return std::string(); };
  return {
      .name = "fp8_matmul_gpu",
      .cpu = &kernels::family("fp8_matmul"),
      .versions =
          {{.name = "gpu v1",
            .description = "dequantize both operands to f32 (a kernel), one cuBLAS f32 GEMM",
            .unsupported = runs_everything,
            .prepare =
                [](const Inputs& in) { return prepared(std::make_shared<V1>(in), &launch_v1); },
            .tolerance = {}},
           // Tensor cores add f16 products into f32 with truncation (Fasi et al., "Numerical
           // behavior of NVIDIA tensor cores", 2021): twice round-to-nearest's roundoff.
           {.name = "gpu v2",
            .description = "tiled kernel: codes decoded to f16 in shared memory, f16 MMAs, "
                           "scales once per K block",
            .unsupported = runs_everything,
            .prepare =
                [](const Inputs& in) { return prepared(std::make_shared<V2>(in), &launch_v2); },
            .tolerance = accumulating_with(0x1p-23)},
           // Hopper's fp8 MMAs keep about 14 bits of their sums (DeepSeek-V3 technical report,
           // 2024, section 3.3.2); the block scaling promotes them to f32 per K block.
           {.name = "gpu v3",
            .description = "cuBLASLt fp8 GEMM, 128 x 128 block scales on w, 1 x 128 on x (sm_90)",
            .unsupported = v3_unsupported,
            .prepare = prepare_v3,
            .tolerance = accumulating_with(0x1p-14)}},
      .extra_configs = {kernels::fp8_matmul_config("square 4096", 4096, 4096, 4096, 128),
                        kernels::fp8_matmul_config("square 8192", 8192, 8192, 8192, 128)},
  };
}

}  // namespace meshtest::gpu
