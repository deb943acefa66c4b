// .safetensors read (mmap, copies only what is asked for) and atomic write.
//
// Layout: u64 little-endian N, N bytes of JSON header {name: {"dtype": "F32"|"F64"|"BF16"|
// "I32"|"I64"|"U8", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data buffer; offsets are relative to the buffer, tensors are row-major.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/core/tensor.hpp"

namespace meshtest {

/// One tensor's entry in a .safetensors header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0;  ///< byte offsets in the data buffer: [begin, end)
  std::uint64_t end = 0;
};

/// A .safetensors file mapped read-only. The header is parsed and validated on open (every
/// tensor's bytes lie inside the file and match shape x dtype size); tensor data is copied
/// only by read / read_slice. Copies share the mapping.
class SafetensorsFile {
 public:
  /// Maps `path` and parses its header; throws Error naming the file and what was wrong.
  static SafetensorsFile open(const std::filesystem::path& path);
  /// Parses a .safetensors image held in memory (copied, validated as open does); `name`
  /// stands for the path in messages and in path().
  static SafetensorsFile from_bytes(std::span<const std::byte> bytes, const std::string& name);

  /// The path it was opened from.
  const std::filesystem::path& path() const { return path_; }
  /// Tensor names, sorted.
  std::vector<std::string> names() const;
  /// Whether the header has a tensor `name`.
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  /// Entry of `name`; throws Error listing some available names if it is missing.
  const TensorInfo& info(std::string_view name) const;
  /// The whole tensor `name`.
  Tensor read(std::string_view name) const;
  /// [r.start, r.start + r.size) along `dim` of tensor `name`; reads only those bytes.
  Tensor read_slice(std::string_view name, int dim, Range r) const;
  /// The "__metadata__" string map (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  /// Parses the header of map_ (`size` bytes, at least 8) and fills the tables.
  void parse_header(std::uint64_t size);

  std::filesystem::path path_;
  std::shared_ptr<const std::byte> map_;  // the whole file; unmapped with the last copy
  const std::byte* data_ = nullptr;       // start of the data buffer inside map_
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` in the given order (names unique, not "__metadata__") and `metadata` as
/// .safetensors, atomically (temp file + rename). The JSON header is compact with sorted keys
/// and padded with spaces to a multiple of 8 bytes.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// The safetensors dtype name: "F32", "F64", "BF16", "I32", "I64", "U8".
std::string_view safetensors_dtype_name(DType t);

}  // namespace meshtest
