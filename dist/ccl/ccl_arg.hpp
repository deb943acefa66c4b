// ccl_arg: a collective's operand as the front ends see it (bytes, shape, dtype and the memory
// holding them: host or a CUDA device), whatever type owns the storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "src/core/dtype.hpp"
#include "src/core/shape.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {

/// Where an operand's bytes live.
struct Memory {
  enum class Kind : std::uint8_t { host, cuda };
  Kind kind = Kind::host;
  int ordinal = -1;  ///< the CUDA device ordinal (cuda only)

  static Memory host() { return {}; }
  static Memory cuda(int ordinal) { return {.kind = Kind::cuda, .ordinal = ordinal}; }
  bool is_host() const { return kind == Kind::host; }
  bool operator==(const Memory&) const = default;
};

/// "host" or "cuda:<ordinal>".
std::string to_string(Memory m);
/// "host" or "cuda": the kind alone (the same on every device of a group, whose ordinals differ).
std::string_view kind_name(Memory m);

/// A view of one operand of a collective: storage owned elsewhere (a host Tensor, a tensor on a
/// GPU), contiguous and row-major. The front ends read only metadata from it; a path moves the
/// bytes. An input is only read, though `data` is not const (one view type for inputs and
/// outputs; all_reduce_inplace's operand is both).
struct CclArg {
  std::byte* data = nullptr;       ///< the first byte, in `where`
  Shape shape = {};                ///< dims (rank 0: a scalar)
  DType dtype = DType::f32;        ///< element type
  Memory where = {};               ///< host or a GPU
  const Tensor* tensor = nullptr;  ///< the host Tensor viewed (host_arg), else null
  /// What the operand's owner found wrong with it before the call (e.g. a tensor on another GPU
  /// than the rank's), or "": the front end reports it as this device's error, the same on
  /// every device of the group (Call::local_error), before any data moves.
  std::string error = {};

  int rank() const { return shape.rank(); }
  std::int64_t numel() const { return shape.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return numel() == 0; }
};

/// The view of a host tensor.
CclArg host_arg(const Tensor& t);

/// "f32[2, 3]" in host memory (as describe(const Tensor&)), "f32[2, 3] on cuda:0" elsewhere.
std::string describe(const CclArg& x);

/// Allocates a collective's output of the given shape and dtype in the input's memory (any
/// bytes: the collective overwrites them) and returns its view. The front ends call it once,
/// after the group has agreed, when the output's shape is known.
using MakeOutput = std::function<CclArg(const Shape& shape, DType dtype)>;

/// A MakeOutput that allocates a host Tensor into `out` (which must outlive the call).
MakeOutput host_output(Tensor& out);

}  // namespace meshtest::dist
