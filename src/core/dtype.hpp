// DType: the element types of a Tensor, their sizes and names, and a visitor.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/core/error.hpp"
#include "src/core/f16.hpp"

namespace meshtest {

using bf16 = Eigen::bfloat16;

/// Element type of a Tensor. u8 holds packed formats (MXFP4 blocks, e8m0 scales). New types go
/// at the end: the values stay as they were.
enum class DType : std::uint8_t { f32, f64, bf16, i32, i64, u8, f16 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                                       DType::i32, DType::i64, DType::u8};

/// Bytes per element.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::f16:
      return 2;
  }
  return 0;
}

/// Short name: "f32", "f64", "bf16", "f16", "i32", "i64", "u8".
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::f16:
      return "f16";
  }
  return "?";
}

/// Parses a name made by dtype_name; throws Error for anything else.
DType dtype_from_name(std::string_view name);

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

/// The 2-byte floats (bf16, f16), which computations widen to f32 and round back once.
constexpr bool widens_to_f32(DType t) { return t == DType::bf16 || t == DType::f16; }

template <class T>
struct type_tag {
  using type = T;
};

/// The DType of a C++ element type.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}

/// Calls f(type_tag<T>{}) with T the C++ type of `t`:
///   visit_dtype(t, [&]<class T>(type_tag<T>) { ... });
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(type_tag<float>{});
    case DType::f64:
      return f(type_tag<double>{});
    case DType::bf16:
      return f(type_tag<bf16>{});
    case DType::i32:
      return f(type_tag<std::int32_t>{});
    case DType::i64:
      return f(type_tag<std::int64_t>{});
    case DType::u8:
      return f(type_tag<std::uint8_t>{});
    case DType::f16:
      return f(type_tag<f16>{});
  }
  fail("invalid DType value {}", static_cast<int>(t));
}

}  // namespace meshtest

template <>
struct fmt::formatter<meshtest::DType> : fmt::formatter<std::string_view> {
  auto format(meshtest::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(meshtest::dtype_name(t), ctx);
  }
};
