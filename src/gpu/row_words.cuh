// row_words: copies of whole rows as bytes in the widest word that fits, for the .cu files of
// src/gpu (the permutation's gather, the embedding's rows).
#pragma once

#include <cstdint>

namespace meshtest::gpu::detail {

/// Calls f(W{}) with W the widest of uint4 (16 bytes), u64, u32, u16 and u8 whose size divides
/// row_bytes and both addresses: rows of row_bytes bytes from `from` to `to` copied a word at a
/// time. Returns f's result.
template <class F>
auto with_row_words(std::int64_t row_bytes, const void* from, const void* to, F&& f) {
  const auto fits = [&](std::int64_t w) {
    return row_bytes % w == 0 && reinterpret_cast<std::uintptr_t>(from) % w == 0 &&
           reinterpret_cast<std::uintptr_t>(to) % w == 0;
  };
  if (fits(16)) return f(uint4{});
  if (fits(8)) return f(std::uint64_t{});
  if (fits(4)) return f(std::uint32_t{});
  if (fits(2)) return f(std::uint16_t{});
  return f(std::uint8_t{});
}

/// Threads for a block over `words` words of a row: whole warps, at most `most`.
inline int row_threads(std::int64_t words, int most) {
  return words < most ? static_cast<int>((words + 31) / 32 * 32) : most;
}

}  // namespace meshtest::gpu::detail
