// cublas: the cuBLAS and cuBLASLt status check and owned handles, shared by gpu::Blas (blas.hpp)
// and the GPU kernel versions (kernels/).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace meshtest::gpu {

/// Throws meshtest::Error "cuBLAS error <name> in `<expr>` (file:line)".
[[noreturn]] void cublas_fail(cublasStatus_t status, const char* expr, const char* file, int line);

/// An owned cuBLAS handle on the current device, its math mode the default (no TF32: f32
/// GEMMs with CUBLAS_COMPUTE_32F are f32 throughout). Move-only.
class BlasHandle {
 public:
  BlasHandle();
  ~BlasHandle();
  BlasHandle(BlasHandle&& other) noexcept;
  BlasHandle& operator=(BlasHandle&& other) noexcept;
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

/// An owned cuBLASLt handle. Move-only.
class LtHandle {
 public:
  LtHandle();
  ~LtHandle();
  LtHandle(LtHandle&& other) noexcept;
  LtHandle& operator=(LtHandle&& other) noexcept;
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

}  // namespace meshtest::gpu

/// Throws meshtest::Error naming the status, the expression and file:line when `expr` (a
/// cublasStatus_t) is not CUBLAS_STATUS_SUCCESS.
#define MESHTEST_CUBLAS_CHECK(expr)                                                     \
  do {                                                                                  \
    const cublasStatus_t meshtest_cublas_status_ = (expr);                              \
    if (meshtest_cublas_status_ != CUBLAS_STATUS_SUCCESS)                               \
      ::meshtest::gpu::cublas_fail(meshtest_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)
