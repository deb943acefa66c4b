// Shape: up to six dims, row-major; and the array_split rule.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "src/core/error.hpp"

namespace meshtest {

/// Dims of a Tensor, outermost first (row-major, C order). Rank 0..6.
class Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : Shape(std::span(dims.begin(), dims.size())) {}
  explicit Shape(std::span<const std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims) : Shape(std::span(dims)) {}

  int rank() const { return rank_; }
  std::int64_t operator[](int d) const { return dims_[check_dim(d)]; }
  std::int64_t& operator[](int d) { return dims_[check_dim(d)]; }
  /// Number of elements (1 for rank 0).
  std::int64_t numel() const;
  /// Product of dims [0, d) and of dims (d, rank).
  std::int64_t outer(int d) const;
  std::int64_t inner(int d) const;
  /// Accepts d in [-rank, rank) and returns it in [0, rank); throws Error otherwise.
  int normalize_dim(int d) const;
  /// This shape with dim d set to n.
  Shape with(int d, std::int64_t n) const;
  std::vector<std::int64_t> vec() const { return {dims_.begin(), dims_.begin() + rank_}; }
  std::string str() const;

  bool operator==(const Shape& o) const;

 private:
  int check_dim(int d) const;
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

/// A contiguous range [start, start + size) of one dim.
struct Range {
  std::int64_t start = 0;
  std::int64_t size = 0;
  bool operator==(const Range&) const = default;
};

/// numpy array_split rule: n split over p parts gives the first n % p parts
/// ceil(n/p) and the rest floor(n/p). Returns part i's range.
Range split_range(std::int64_t n, int p, int i);
/// Sizes of all p parts by the array_split rule.
std::vector<std::int64_t> split_sizes(std::int64_t n, int p);

}  // namespace meshtest

template <>
struct fmt::formatter<meshtest::Shape> : fmt::formatter<std::string> {
  auto format(const meshtest::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
