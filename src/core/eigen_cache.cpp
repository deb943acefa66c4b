// Eigen's GEMM blocking set from MESHTEST_EIGEN_CACHE: another processor's summation order.
#include "src/core/eigen_cache.hpp"

#include <fmt/format.h>

#include <Eigen/Core>
#include <cstdlib>
#include <vector>

#include "src/core/error.hpp"

namespace meshtest {
namespace {

constexpr std::ptrdiff_t kKiB = 1024;

std::string show_size(std::ptrdiff_t b) {
  if (b % (kKiB * kKiB * kKiB) == 0) return fmt::format("{}G", b / (kKiB * kKiB * kKiB));
  if (b % (kKiB * kKiB) == 0) return fmt::format("{}M", b / (kKiB * kKiB));
  if (b % kKiB == 0) return fmt::format("{}K", b / kKiB);
  return fmt::format("{}", b);
}

std::ptrdiff_t parse_size(std::string_view s, std::string_view text, std::string_view what) {
  std::ptrdiff_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        mult = kKiB;
        break;
      case 'M':
      case 'm':
        mult = kKiB * kKiB;
        break;
      case 'G':
      case 'g':
        mult = kKiB * kKiB * kKiB;
        break;
      default:
        break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  MESHTEST_CHECK(!s.empty() && s.size() <= 12 && s.find_first_not_of("0123456789") == s.npos,
                 "{} '{}': '{}' is not a size (a positive integer of bytes with an optional K, "
                 "M or G suffix, e.g. 32K,512K,16M)",
                 what, text, s);
  const std::ptrdiff_t bytes = std::stoll(std::string(s)) * mult;
  MESHTEST_CHECK(bytes >= kKiB && bytes <= 64 * kKiB * kKiB * kKiB,
                 "{} '{}': {} bytes is out of range [1K, 64G]", what, text, bytes);
  return bytes;
}

}  // namespace

std::string CacheSizes::str() const {
  return fmt::format("l1 {}, l2 {}, l3 {}", show_size(l1), show_size(l2), show_size(l3));
}

CacheSizes parse_cache_sizes(std::string_view text, std::string_view what) {
  std::vector<std::string_view> parts;
  std::string_view rest = text;
  for (std::size_t comma; (comma = rest.find(',')) != rest.npos; rest.remove_prefix(comma + 1)) {
    parts.push_back(rest.substr(0, comma));
  }
  parts.push_back(rest);
  MESHTEST_CHECK(parts.size() == 3, "{} '{}': expected three sizes L1,L2,L3 (e.g. 32K,512K,16M)",
                 what, text);
  return {.l1 = parse_size(parts[0], text, what),
          .l2 = parse_size(parts[1], text, what),
          .l3 = parse_size(parts[2], text, what)};
}

CacheSizes eigen_cache_sizes() {
  return {.l1 = Eigen::l1CacheSize(), .l2 = Eigen::l2CacheSize(), .l3 = Eigen::l3CacheSize()};
}

std::optional<CacheSizes> apply_eigen_cache_env() {
  const char* env = std::getenv("MESHTEST_EIGEN_CACHE");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const CacheSizes c = parse_cache_sizes(env, "MESHTEST_EIGEN_CACHE");
  Eigen::setCpuCacheSizes(c.l1, c.l2, c.l3);
  return c;
}

}  // namespace meshtest
