// visit_real: dispatch of an op on its two real compute dtypes, f32 and f64 (no bf16).
#pragma once

#include <string_view>

#include "src/core/tensor.hpp"

namespace meshtest {

/// Calls f(type_tag<S>{}) with S = float or double; any other dtype throws an Error naming `op`.
template <class F>
decltype(auto) visit_real(DType t, std::string_view op, F&& f) {
  if (t == DType::f32) return f(type_tag<float>{});
  if (t == DType::f64) return f(type_tag<double>{});
  fail("{}: dtype {} is not supported (expected f32 or f64)", op, t);
}

}  // namespace meshtest
