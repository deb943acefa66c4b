// Program cache: an op builds a plan (counts, index maps, workspaces, ...) on the first call
// of a signature and reuses it on later calls; on/off switch and hit/miss counters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"

namespace meshtest::perf {

/// What an op keeps between calls of one signature. Ops derive their plans from it.
struct Plan {
  virtual ~Plan() = default;
};

/// An op call's signature: the op code, then every shape, dtype and option that changes the
/// plan, as text (the cache key) and its 64-bit FNV-1a hash (cheap to compare across devices).
class Signature {
 public:
  explicit Signature(std::string_view op);  ///< reserves room for a typical key
  Signature& add(std::string_view key, std::int64_t value);
  Signature& add(std::string_view key, const Shape& shape, DType dtype);
  const std::string& key() const { return key_; }
  std::uint64_t hash() const;

 private:
  std::string key_;
};

/// Plans by signature. Not thread-safe: ops run on one thread per process.
class ProgramCache {
 public:
  /// On by default. Off: every call builds a fresh plan (counted as a miss) and nothing is kept.
  bool enabled() const { return enabled_; }
  void set_enabled(bool on);
  std::int64_t hits() const { return hits_; }
  std::int64_t misses() const { return misses_; }
  std::size_t size() const { return plans_.size(); }
  /// Drops every plan and zeroes the counters.
  void clear();
  /// At most this many plans are kept (default 256): inserting into a full cache drops every
  /// plan first, so shapes that change on every call (uneven pieces) cannot grow it without
  /// bound. Plans in use stay alive through their shared_ptr.
  void set_capacity(std::size_t n);
  std::size_t capacity() const { return capacity_; }

  /// The plan of `sig`: the cached one (a hit) or `build()`'s, kept when enabled (a miss).
  template <class P, class Build>
  std::shared_ptr<P> get(const Signature& sig, Build&& build) {
    if (enabled_) {
      if (auto it = plans_.find(sig.key()); it != plans_.end()) {
        ++hits_;
        return std::static_pointer_cast<P>(it->second);
      }
    }
    ++misses_;
    std::shared_ptr<P> plan = build();
    if (enabled_) {
      if (plans_.size() >= capacity_) plans_.clear();
      plans_.emplace(sig.key(), plan);
    }
    return plan;
  }

 private:
  bool enabled_ = true;
  std::int64_t hits_ = 0, misses_ = 0;
  std::size_t capacity_ = 256;
  std::unordered_map<std::string, std::shared_ptr<Plan>> plans_;
};

/// The process-wide program cache that meshtest's ops use.
ProgramCache& program_cache();

/// Turns the process-wide cache off (or on) for a scope and restores the previous state.
class ProgramCacheSwitch {
 public:
  explicit ProgramCacheSwitch(bool on);
  ~ProgramCacheSwitch();
  ProgramCacheSwitch(const ProgramCacheSwitch&) = delete;
  ProgramCacheSwitch& operator=(const ProgramCacheSwitch&) = delete;

 private:
  bool was_;
};

}  // namespace meshtest::perf
