// Shape and the array_split rule.
#include "src/core/shape.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

namespace meshtest {

Shape::Shape(std::span<const std::int64_t> dims) {
  MESHTEST_CHECK(dims.size() <= kMaxRank, "Shape: rank {} exceeds the maximum of {}", dims.size(),
                 kMaxRank);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    MESHTEST_CHECK(dims[i] >= 0, "Shape: dim {} is {}; dims must be >= 0", i, dims[i]);
    dims_[i] = dims[i];
  }
  rank_ = static_cast<int>(dims.size());
  // Every product of dims (numel, outer, inner) must fit in int64, zero dims skipped.
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) {
    const std::int64_t d = std::max<std::int64_t>(dims_[i], 1);
    MESHTEST_CHECK(n <= std::numeric_limits<std::int64_t>::max() / d,
                   "Shape {}: a product of its dims overflows int64", str());
    n *= d;
  }
}

int Shape::check_dim(int d) const {
  MESHTEST_CHECK(d >= 0 && d < rank_, "Shape {}: dim {} out of range [0, {})", str(), d, rank_);
  return d;
}

std::int64_t Shape::numel() const { return outer(rank_); }

std::int64_t Shape::outer(int d) const {
  std::int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= dims_[i];
  return n;
}

std::int64_t Shape::inner(int d) const {
  std::int64_t n = 1;
  for (int i = d + 1; i < rank_; ++i) n *= dims_[i];
  return n;
}

int Shape::normalize_dim(int d) const {
  MESHTEST_CHECK(d >= -rank_ && d < rank_, "dim {} out of range for a tensor of rank {} (shape {})",
                 d, rank_, str());
  return d < 0 ? d + rank_ : d;
}

Shape Shape::with(int d, std::int64_t n) const {
  Shape s = *this;
  s[normalize_dim(d)] = n;
  return s;
}

std::string Shape::str() const { return fmt::format("[{}]", fmt::join(vec(), ", ")); }

bool Shape::operator==(const Shape& o) const {
  return rank_ == o.rank_ && std::equal(dims_.begin(), dims_.begin() + rank_, o.dims_.begin());
}

Range split_range(std::int64_t n, int p, int i) {
  MESHTEST_CHECK(p > 0, "split_range: {} parts; need at least 1", p);
  MESHTEST_CHECK(i >= 0 && i < p, "split_range: part {} out of range [0, {})", i, p);
  MESHTEST_CHECK(n >= 0, "split_range: size {} is negative", n);
  const std::int64_t base = n / p, extra = n % p;
  const std::int64_t start = i * base + std::min<std::int64_t>(i, extra);
  return {start, base + (i < extra ? 1 : 0)};
}

std::vector<std::int64_t> split_sizes(std::int64_t n, int p) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) out[i] = split_range(n, p, i).size;
  return out;
}

}  // namespace meshtest
