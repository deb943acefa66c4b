// Heap accounting for meshtest-bench: live and peak heap bytes, counted only inside a window.
#pragma once

#include <cstdint>

namespace meshtest::bench {

/// Counts heap bytes (malloc_usable_size of every malloc/calloc/realloc/memalign minus frees)
/// while alive; the interposed allocator forwards to glibc and does no accounting otherwise.
/// Not nestable: at most one window at a time in the process.
class HeapWindow {
 public:
  HeapWindow();
  ~HeapWindow();
  HeapWindow(const HeapWindow&) = delete;
  HeapWindow& operator=(const HeapWindow&) = delete;

  /// Highest (allocated - freed) byte count reached since the window opened (>= 0).
  [[nodiscard]] std::int64_t peak() const;
};

}  // namespace meshtest::bench
