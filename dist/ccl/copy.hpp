// copy: the byte copies of the CCL paths — memcpy, but around two x86 pitfalls: glibc's
// `rep movsb` copies crawl on AMD Zen when the destination lies just past the source modulo a
// page (measured on a Zen machine: 1.3-2.4 GB/s against 25-34 GB/s for 64-256 KiB), and a
// normal store reads its cache line before writing it, so a large output written once costs
// twice its bytes in memory traffic (streaming stores write it once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace meshtest::dist::detail {

/// Outputs of at least this many bytes per call and device are written with streaming stores
/// by the in-place (arena) collectives: past a few MiB per device the group's outputs leave
/// the caches anyway.
inline constexpr std::size_t kStreamOutput = std::size_t{4} << 20;

/// memcpy of [src, src + n) to dst in pieces of 2 KiB (below glibc's `rep movsb` threshold).
void copy_in_pieces(void* dst, const void* src, std::size_t n);

/// memcpy(dst, src, n); in 2 KiB pieces when dst lies 1-63 bytes past src modulo 4096 and n
/// is in `rep movsb`'s range (4 KiB to 512 KiB), where that instruction crawls on AMD Zen.
inline void copy_bytes(void* dst, const void* src, std::size_t n) {
  const auto gap =
      (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(src)) & 4095U;
  if (gap == 0 || gap >= 64 || n < 4096 || n >= (std::size_t{512} << 10)) {
    std::memcpy(dst, src, n);
    return;
  }
  copy_in_pieces(dst, src, n);
}

/// The same bytes as memcpy, written with non-temporal (streaming) stores on x86-64: the
/// destination's lines are neither read first nor kept in cache. Ends with a store fence, so
/// the bytes are visible to the other processes of the node like ordinary stores once the
/// collective's next step publishes them; `fence` false leaves it to one store_fence() after a
/// run of such copies (each fence waits for the stores in flight). Elsewhere memcpy.
void copy_streaming(void* dst, const void* src, std::size_t n, bool fence = true);

/// Orders every streaming store before it ahead of every store after it (sfence on x86-64).
void store_fence();

}  // namespace meshtest::dist::detail
