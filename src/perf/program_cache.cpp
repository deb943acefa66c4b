// Program cache: signatures, the plan map and its counters.
#include "src/perf/program_cache.hpp"

#include <array>
#include <charconv>

namespace meshtest::perf {

Signature::Signature(std::string_view op) : key_(op) { key_.reserve(96); }

namespace {
// Appends the decimal digits of v (std::to_chars: no locale, no allocation).
void append(std::string& out, std::int64_t v) {
  std::array<char, 24> buf{};
  const auto end = std::to_chars(buf.data(), buf.data() + buf.size(), v).ptr;
  out.append(buf.data(), end);
}
}  // namespace

Signature& Signature::add(std::string_view key, std::int64_t value) {
  key_ += ';';
  key_ += key;
  key_ += '=';
  append(key_, value);
  return *this;
}

Signature& Signature::add(std::string_view key, const Shape& shape, DType dtype) {
  key_ += ';';
  key_ += key;
  key_ += '=';
  key_ += dtype_name(dtype);
  key_ += '[';
  for (int d = 0; d < shape.rank(); ++d) {
    if (d > 0) key_ += ", ";
    append(key_, shape[d]);
  }
  key_ += ']';
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

void ProgramCache::set_capacity(std::size_t n) {
  MESHTEST_CHECK(n > 0, "ProgramCache::set_capacity: capacity must be >= 1, got 0");
  capacity_ = n;
  if (plans_.size() > n) plans_.clear();
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
