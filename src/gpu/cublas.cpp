// cuBLAS and cuBLASLt handles and the status check.
#include "src/gpu/cublas.hpp"

#include <utility>

#include "src/core/error.hpp"

namespace meshtest::gpu {

void cublas_fail(cublasStatus_t status, const char* expr, const char* file, int line) {
  fail("cuBLAS error {} ({}) in `{}` ({}:{})", cublasGetStatusName(status),
       cublasGetStatusString(status), expr, file, line);
}

BlasHandle::BlasHandle() { MESHTEST_CUBLAS_CHECK(cublasCreate(&handle_)); }
BlasHandle::~BlasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}
BlasHandle::BlasHandle(BlasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}
BlasHandle& BlasHandle::operator=(BlasHandle&& other) noexcept {
  std::swap(handle_, other.handle_);
  return *this;
}

LtHandle::LtHandle() { MESHTEST_CUBLAS_CHECK(cublasLtCreate(&handle_)); }
LtHandle::~LtHandle() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}
LtHandle::LtHandle(LtHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
LtHandle& LtHandle::operator=(LtHandle&& other) noexcept {
  std::swap(handle_, other.handle_);
  return *this;
}

}  // namespace meshtest::gpu
