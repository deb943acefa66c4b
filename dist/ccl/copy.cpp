// copy: copy_in_pieces and the SSE2 streaming copy.
#include "dist/ccl/copy.hpp"

#include <algorithm>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace meshtest::dist::detail {

void copy_in_pieces(void* dst, const void* src, std::size_t n) {
  constexpr std::size_t kPiece = 2048;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (std::size_t at = 0; at < n; at += kPiece)
    std::memcpy(d + at, s + at, std::min(kPiece, n - at));
}

void copy_streaming(void* dst, const void* src, std::size_t n, bool fence) {
#if defined(__SSE2__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15U)) & 15U;
  if (n < head + 256) {
    copy_bytes(d, s, n);
    return;
  }
  std::memcpy(d, s, head);  // to a 16-byte aligned destination
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
  if (fence) _mm_sfence();
#else
  (void)fence;
  std::memcpy(dst, src, n);
#endif
}

void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace meshtest::dist::detail
