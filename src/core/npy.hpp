// .npy read/write (NumPy format 1.0/2.0/3.0, C order), and the atomic file write it shares.
//
// dtypes: f32 '<f4', f64 '<f8', f16 '<f2', i32 '<i4', i64 '<i8', u8 '|u1'. NumPy has no bf16, so
// bf16 is written with descr 'bfloat16', the dtype name of ml_dtypes (JAX, TF): np.load reads it
// once `import ml_dtypes` has registered the name. On read, 'bfloat16' and '<V2' (what
// np.save writes for an ml_dtypes.bfloat16 array) both load as bf16.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "src/core/file.hpp"
#include "src/core/tensor.hpp"

namespace meshtest {

/// Reads a .npy file; throws Error naming the file and what was wrong.
Tensor read_npy(const std::filesystem::path& path);
/// Parses .npy bytes; `name` names the source in error messages.
Tensor read_npy_bytes(std::span<const std::byte> bytes, std::string_view name);
/// The .npy encoding of `t`, byte-identical to np.save of the same array (format 1.0,
/// or 2.0 when the header needs more than 65535 bytes).
std::vector<std::byte> npy_bytes(const Tensor& t);
/// Writes `t` as .npy atomically (temp file + rename); throws Error naming the file.
void write_npy(const std::filesystem::path& path, const Tensor& t);

}  // namespace meshtest
