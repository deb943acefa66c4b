// tensor_checks: the input checks the GPU ops share, and a DeviceTensor as a perf record sees it.
#pragma once

#include <string_view>

#include "src/core/error.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/perf/op_record.hpp"

namespace meshtest::gpu {

/// The record's view of t: shape, dtype and "DEVICE".
inline perf::TensorInfo info(const DeviceTensor& t) {
  return {.shape = t.shape(), .dtype = t.dtype()};
}

/// Throws "<op>: <name> is <describe(t)>, expected dtype <want>" unless t has dtype `want`.
inline void check_dtype(std::string_view op, std::string_view name, const DeviceTensor& t,
                        DType want) {
  MESHTEST_CHECK(t.dtype() == want, "{}: {} is {}, expected dtype {}", op, name, describe(t), want);
}

/// Throws "<op>: <name> is <describe(t)>, but the op runs on cuda:<device>" unless t is empty or
/// on `device`.
inline void check_on_device(std::string_view op, std::string_view name, const DeviceTensor& t,
                            int device) {
  MESHTEST_CHECK(t.empty() || t.device() == device, "{}: {} is {}, but the op runs on cuda:{}", op,
                 name, describe(t), device);
}

}  // namespace meshtest::gpu
