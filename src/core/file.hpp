// Files: atomic writes (a temp file beside the target, then rename) and whole-file reads.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

namespace meshtest {

/// Writes the concatenation of `parts` to a temp file beside `path`, then renames it over
/// `path`: readers see the old file or the whole new one. Throws Error naming the file.
void write_file_atomic(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> parts);

/// The whole file at `path` as bytes in a string. Throws Error naming the file when it cannot
/// be read.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace meshtest
