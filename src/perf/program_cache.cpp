// Program cache: signatures, the plan map and its counters.
#include "src/perf/program_cache.hpp"

#include <fmt/format.h>

namespace meshtest::perf {

Signature::Signature(std::string_view op) : key_(op) {}

Signature& Signature::add(std::string_view key, std::int64_t value) {
  fmt::format_to(std::back_inserter(key_), ";{}={}", key, value);
  return *this;
}

Signature& Signature::add(std::string_view key, const Shape& shape, DType dtype) {
  fmt::format_to(std::back_inserter(key_), ";{}={}{}", key, dtype_name(dtype), shape.str());
  return *this;
}

std::uint64_t Signature::hash() const {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64
  for (const char c : key_) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

void ProgramCache::set_enabled(bool on) {
  enabled_ = on;
  if (!on) plans_.clear();
}

void ProgramCache::clear() {
  plans_.clear();
  hits_ = misses_ = 0;
}

ProgramCache& program_cache() {
  static ProgramCache cache;
  return cache;
}

ProgramCacheSwitch::ProgramCacheSwitch(bool on) : was_(program_cache().enabled()) {
  program_cache().set_enabled(on);
}

ProgramCacheSwitch::~ProgramCacheSwitch() { program_cache().set_enabled(was_); }

}  // namespace meshtest::perf
