// Atomic file writes: a temp file beside the target, then rename.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace meshtest {

/// Writes the concatenation of `parts` to a temp file beside `path`, then renames it over
/// `path`: readers see the old file or the whole new one. Throws Error naming the file.
void write_file_atomic(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> parts);

}  // namespace meshtest
