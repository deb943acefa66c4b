// Eigen's GEMM blocking set from MESHTEST_EIGEN_CACHE: another processor's summation order.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace meshtest {

// Eigen cuts a matrix product into blocks sized from the cache sizes it reads from the
// processor, and the blocking decides the order in which each dot product is added up. Setting
// the sizes makes this machine add in the order another processor would, so a test can be run
// as on that processor (docs/tolerances.md).

/// Cache sizes in bytes, as Eigen::setCpuCacheSizes takes them.
struct CacheSizes {
  std::ptrdiff_t l1 = 0;
  std::ptrdiff_t l2 = 0;
  std::ptrdiff_t l3 = 0;

  /// "l1 32K, l2 512K, l3 16M".
  std::string str() const;
};

/// Parses "L1,L2,L3": three sizes in bytes, each a positive integer with an optional K, M or G
/// suffix (powers of 1024), e.g. "32K,512K,16M". Throws meshtest::Error naming `what` and the
/// text for anything else, and when a size is below 1K or above 64G.
CacheSizes parse_cache_sizes(std::string_view text, std::string_view what = "cache sizes");

/// The sizes Eigen's blocking uses now.
CacheSizes eigen_cache_sizes();

/// When the environment variable MESHTEST_EIGEN_CACHE is set (and not empty), passes its sizes
/// to Eigen::setCpuCacheSizes and returns them; else returns nothing and leaves Eigen as it is.
/// Every test binary and tool calls this first. Throws meshtest::Error for a malformed value.
std::optional<CacheSizes> apply_eigen_cache_env();

}  // namespace meshtest
