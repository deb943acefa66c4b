// agreement: the options a collective's devices must pass alike, the front end's and its
// paths', agreed by Call::agree (detail.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace meshtest::dist::detail {

/// An option that every device of the group must pass with the same value.
struct AgreedOption {
  std::string_view name;
  std::int64_t value = 0;
  std::string (*show)(std::int64_t) = nullptr;  ///< how to print a value (default: the number)
};

/// An AgreedOption printer for ReduceOp values: "sum", "max", ...
std::string show_reduce_op(std::int64_t op);

/// The options of one call: the front end's, then its paths' (Path::agreed_options), then the
/// chosen path's name; at most kMax, without an allocation.
class AgreedOptions {
 public:
  static constexpr std::size_t kMax = 6;
  /// Appends o; more than kMax options is a programming error (an Error).
  void add(const AgreedOption& o);
  std::span<const AgreedOption> all() const { return {v_.data(), n_}; }

 private:
  std::array<AgreedOption, kMax> v_{};
  std::size_t n_ = 0;
};

}  // namespace meshtest::dist::detail
