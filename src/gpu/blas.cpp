// blas: the cuBLASLt handle, its plan cache and the row-major GEMM with a bias epilogue.
#include "src/gpu/blas.hpp"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <string_view>
#include <tuple>
#include <vector>

#include "src/gpu/capture.hpp"
#include "src/gpu/cublas.hpp"
#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

// The largest power of two up to 256 that divides every address (0 for null ones).
std::uint32_t common_alignment(std::initializer_list<const void*> ptrs) {
  std::uintptr_t bits = 256;
  for (const void* p : ptrs) bits |= reinterpret_cast<std::uintptr_t>(p);
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

// One shape's descriptors and algorithm; the layouts view row-major y = x·wᵀ as column-major
// yᵀ[n, m] = (wᵀ)ᵀ[n, k] · xᵀ[k, m]: A = w (k x n, lda k, transposed), B = x (k x m, ldb k),
// D = y (n x m, ldd n), so the bias (one per row of D) runs along y's columns.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

using PlanKey = std::tuple<DType, std::int64_t, std::int64_t, std::int64_t, bool, std::uint32_t>;

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

struct Blas::Impl {
  std::shared_ptr<Stream> stream = std::make_shared<Stream>();  // outputs keep it alive
  int device = current_device();
  LtHandle handle;
  std::unique_ptr<BlasHandle> cublas;  // made by Blas::cublas()
  void* workspace = nullptr;
  // gemm_segments' side streams, each with its workspace and its join event, and the fork event
  // (made on its first call).
  static constexpr int kSides = 4;  // 8 measured no better (docs/moe.md)
  std::vector<Stream> sides;
  std::vector<void*> side_workspaces;
  std::vector<cudaEvent_t> joins;
  cudaEvent_t fork = nullptr;

  void make_sides() {
    if (!sides.empty()) return;
    const DeviceGuard guard(device);
    MESHTEST_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int s = 0; s < kSides; ++s) {
      sides.emplace_back();
      side_workspaces.push_back(nullptr);
      MESHTEST_CUDA_CHECK(cudaMalloc(&side_workspaces.back(), kWorkspaceBytes));
      joins.push_back(nullptr);
      MESHTEST_CUDA_CHECK(cudaEventCreateWithFlags(&joins.back(), cudaEventDisableTiming));
    }
  }
  std::map<PlanKey, Plan> plans;

  Impl() { MESHTEST_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes)); }
  ~Impl() {
    plans.clear();
    const DeviceGuard guard(device);
    cudaStreamSynchronize(stream->get());  // the workspace may be in use until then
    cudaFree(workspace);
    for (std::size_t s = 0; s < sides.size(); ++s) {
      cudaStreamSynchronize(sides[s].get());
      cudaFree(side_workspaces[s]);
      cudaEventDestroy(joins[s]);
    }
    if (fork != nullptr) cudaEventDestroy(fork);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Plan& plan(DType t, std::int64_t m, std::int64_t n, std::int64_t k, const void* bias,
             std::uint32_t align) {
    const PlanKey key{t, m, n, k, bias != nullptr, align};
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    Plan& p = plans[key];
    try {
      build(p, t, m, n, k, bias, align);
    } catch (...) {
      plans.erase(key);
      throw;
    }
    return p;
  }

  void build(Plan& p, DType t, std::int64_t m, std::int64_t n, std::int64_t k, const void* bias,
             std::uint32_t align) const {
    const cudaDataType_t ct = cuda_type(t);
    MESHTEST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    MESHTEST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    MESHTEST_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias != nullptr) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const auto bias_type = static_cast<std::int32_t>(ct);
      MESHTEST_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      MESHTEST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
      MESHTEST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    MESHTEST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ct, u(k), u(n), k));
    MESHTEST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ct, u(k), u(m), k));
    MESHTEST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, ct, u(n), u(m), n));

    cublasLtMatmulPreference_t pref = nullptr;
    MESHTEST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const std::size_t ws = kWorkspaceBytes;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (const auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
    }
    // Split-K partial sums only in f32: the in-place and output-type schemes add the parts in
    // the output's dtype, a bf16 rounding per part (bf16 accumulates in f32, rounded once).
    const std::uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                               &reduction, sizeof reduction);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulAlgoGetHeuristic(handle.get(), p.desc, p.a, p.b, p.d, p.d, pref, 1, &result,
                                         &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    MESHTEST_CUBLAS_CHECK(s);
    MESHTEST_CHECK(
        found > 0,
        "gpu gemm: cuBLASLt has no algorithm for {} y[{}, {}] = x[{}, {}] * w[{}, {}]^T{} "
        "(pointers aligned to {} bytes) on cuda:{}",
        t, m, n, m, k, n, k, bias != nullptr ? " + bias" : "", align, device);
    p.algo = result.algo;
  }
};

Blas::Blas() : impl_(std::make_unique<Impl>()) {}
Blas::~Blas() = default;
Blas::Blas(Blas&& other) noexcept = default;
Blas& Blas::operator=(Blas&& other) noexcept = default;

cudaStream_t Blas::stream() const { return stream_for(impl_->stream->get()); }
std::shared_ptr<const Stream> Blas::shared_stream() const { return impl_->stream; }
int Blas::device() const { return impl_->device; }
cublasContext* Blas::cublas() {
  if (!impl_->cublas) {
    const DeviceGuard guard(impl_->device);
    impl_->cublas = std::make_unique<BlasHandle>();
    // The stream's workspace (its cuBLASLt GEMMs run in the same order): a capture needs one of
    // the caller's, cuBLAS's own pool allocates.
    MESHTEST_CUBLAS_CHECK(
        cublasSetWorkspace(impl_->cublas->get(), impl_->workspace, kWorkspaceBytes));
  }
  MESHTEST_CUBLAS_CHECK(cublasSetStream(impl_->cublas->get(), stream()));
  return impl_->cublas->get();
}
void Blas::synchronize() const {
  if (capturing_stream() == nullptr) impl_->stream->synchronize();  // a capture keeps one order
}

namespace {

void check_pointer(const void* p, std::string_view what, int device) {
  cudaPointerAttributes a{};
  const cudaError_t err = cudaPointerGetAttributes(&a, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("gpu gemm: {} ({}) is not memory CUDA knows ({}), not memory of cuda:{}", what, p,
         cudaGetErrorName(err), device);
  }
  MESHTEST_CHECK(a.type == cudaMemoryTypeDevice && a.device == device,
                 "gpu gemm: {} ({}) is {}, not memory of cuda:{}", what, p,
                 a.type == cudaMemoryTypeDevice    ? fmt::format("memory of cuda:{}", a.device)
                 : a.type == cudaMemoryTypeManaged ? std::string("managed memory")
                                                   : std::string("host memory"),
                 device);
}

}  // namespace

void Blas::gemm(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
                const void* w, const void* bias, void* y) {
  if (m > 0 && n > 0) {
    check_pointer(y, "y", impl_->device);
    if (k > 0) check_pointer(x, "x", impl_->device), check_pointer(w, "w", impl_->device);
    if (bias != nullptr) check_pointer(bias, "bias", impl_->device);
  }
  gemm_unchecked(dtype, m, n, k, x, w, bias, y);
}

void Blas::gemm_unchecked(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k,
                          const void* x, const void* w, const void* bias, void* y) {
  MESHTEST_CHECK(dtype == DType::f32 || dtype == DType::bf16,
                 "gpu gemm: dtype {} is not supported (f32 or bf16)", dtype);
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  MESHTEST_CHECK(m >= 0 && n >= 0 && k >= 0 && m <= kMax && n <= kMax && k <= kMax,
                 "gpu gemm: sizes m {} n {} k {} must lie in 0 .. {}", m, n, k, kMax);
  if (m == 0 || n == 0) return;
  const DeviceGuard guard(impl_->device);
  const detail::Float ft = dtype == DType::bf16 ? detail::Float::bf16 : detail::Float::f32;
  if (k == 0) {
    MESHTEST_CUDA_CHECK(detail::launch_broadcast_rows(ft, bias, y, m, n, stream()));
    return;
  }
  launch(dtype, m, n, k, x, w, bias, y, stream(), impl_->workspace);
}

void Blas::launch(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
                  const void* w, const void* bias, void* y, cudaStream_t on, void* workspace) {
  Plan& p = impl_->plan(dtype, m, n, k, bias, common_alignment({x, w, bias, y}));
  if (bias != nullptr) {
    MESHTEST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof bias));
  }
  const float one = 1.0f, zero = 0.0f;
  MESHTEST_CUBLAS_CHECK(cublasLtMatmul(impl_->handle.get(), p.desc, &one, w, p.a, x, p.b, &zero, y,
                                       p.d, y, p.d, &p.algo, workspace, kWorkspaceBytes, on));
}

void Blas::gemm_segments(DType dtype, std::span<const std::int64_t> offsets, std::int64_t n,
                         std::int64_t k, const void* x, const void* w, const void* bias, void* y) {
  const std::size_t es = dtype_size(dtype);
  const auto* xb = static_cast<const std::byte*>(x);
  const auto* wb = static_cast<const std::byte*>(w);
  const auto* bb = static_cast<const std::byte*>(bias);
  auto* yb = static_cast<std::byte*>(y);
  const auto groups = static_cast<std::int64_t>(offsets.size()) - 1;
  std::vector<std::int64_t> order;  // the segments with rows, largest first
  for (std::int64_t e = 0; e < groups; ++e) {
    if (offsets[e + 1] > offsets[e]) order.push_back(e);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return offsets[a + 1] - offsets[a] > offsets[b + 1] - offsets[b];
  });
  const auto one = [&](std::int64_t e, cudaStream_t on, void* workspace) {
    const std::int64_t r0 = offsets[e], m = offsets[e + 1] - offsets[e];
    if (k == 0) {  // y = bias (or 0), as gemm_unchecked
      gemm_unchecked(dtype, m, n, k, nullptr, nullptr, bias != nullptr ? bb + e * n * es : nullptr,
                     yb + r0 * n * es);
      return;
    }
    launch(dtype, m, n, k, xb + r0 * k * es, wb + e * n * k * es,
           bias != nullptr ? bb + e * n * es : nullptr, yb + r0 * n * es, on, workspace);
  };
  MESHTEST_CHECK(dtype == DType::f32 || dtype == DType::bf16,
                 "gpu gemm: dtype {} is not supported (f32 or bf16)", dtype);
  if (order.empty() || n == 0) return;
  const DeviceGuard guard(impl_->device);
  if (capturing_stream() != nullptr || order.size() == 1 || k == 0) {
    for (const std::int64_t e : order) one(e, stream(), impl_->workspace);
    return;
  }
  impl_->make_sides();
  MESHTEST_CUDA_CHECK(cudaEventRecord(impl_->fork, stream()));
  const int sides = std::min<int>(Impl::kSides, static_cast<int>(order.size()));
  std::vector<std::int64_t> load(static_cast<std::size_t>(sides), 0);
  for (int s = 0; s < sides; ++s) {
    MESHTEST_CUDA_CHECK(cudaStreamWaitEvent(impl_->sides[s].get(), impl_->fork, 0));
  }
  for (const std::int64_t e : order) {
    const auto s =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    one(e, impl_->sides[s].get(), impl_->side_workspaces[s]);
    load[s] += offsets[e + 1] - offsets[e];
  }
  for (int s = 0; s < sides; ++s) {
    MESHTEST_CUDA_CHECK(cudaEventRecord(impl_->joins[s], impl_->sides[s].get()));
    MESHTEST_CUDA_CHECK(cudaStreamWaitEvent(stream(), impl_->joins[s], 0));
  }
}

}  // namespace meshtest::gpu
