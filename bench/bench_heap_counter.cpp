// Interposed malloc/free for meshtest-bench: forwards to glibc; counts bytes only in a HeapWindow.
//
// The hooks replace the allocator of the whole meshtest-bench binary (every subcommand), so
// outside a window they cost one relaxed atomic load and a branch: no malloc_usable_size, no
// shared counter traffic. C++ new, std::vector and Eigen temporaries all go through malloc.
// Not a subcommand: the file is named bench_*.cpp only so bench/CMakeLists.txt's glob builds it.
// In AddressSanitizer builds the sanitizer owns malloc (replacing it would bypass its
// interceptors and crash at start-up), so the same counting runs from its allocation hooks.
#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtime's allocator interface (GCC ships no header for it).
extern "C" {
int __sanitizer_install_malloc_and_free_hooks(void (*)(const volatile void*, std::size_t),
                                              void (*)(const volatile void*));
std::size_t __sanitizer_get_allocated_size(const volatile void*);
}
#endif

#include "bench/heap_counter.hpp"
#include "src/core/error.hpp"

namespace {
std::atomic<bool> g_on{false};
std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};

void add_bytes(std::int64_t n) {
  const std::int64_t now = g_live.fetch_add(n, std::memory_order_relaxed) + n;
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
bool counting() { return g_on.load(std::memory_order_relaxed); }

#if !defined(__SANITIZE_ADDRESS__)
void on_alloc(void* p) {
  if (p != nullptr) add_bytes(static_cast<std::int64_t>(malloc_usable_size(p)));
}
void on_free(void* p) {
  if (p != nullptr) {
    g_live.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  }
}
#else
void asan_malloc_hook(const volatile void* p, std::size_t n) {
  if (p != nullptr && counting()) add_bytes(static_cast<std::int64_t>(n));
}
void asan_free_hook(const volatile void* p) {
  if (p != nullptr && counting()) {
    g_live.fetch_sub(static_cast<std::int64_t>(__sanitizer_get_allocated_size(p)),
                     std::memory_order_relaxed);
  }
}
[[maybe_unused]] const int g_hooks =
    __sanitizer_install_malloc_and_free_hooks(&asan_malloc_hook, &asan_free_hook);
#endif
}  // namespace

namespace meshtest::bench {

HeapWindow::HeapWindow() {
  MESHTEST_CHECK(!g_on.load(), "HeapWindow: a window is already open (windows do not nest)");
  g_live.store(0);
  g_peak.store(0);
  g_on.store(true);
}

HeapWindow::~HeapWindow() { g_on.store(false); }

std::int64_t HeapWindow::peak() const { return g_peak.load(); }

}  // namespace meshtest::bench

#if !defined(__SANITIZE_ADDRESS__)
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);

void* malloc(std::size_t n) {
  void* p = __libc_malloc(n);
  if (counting()) on_alloc(p);
  return p;
}
void free(void* p) {
  if (counting()) on_free(p);
  __libc_free(p);
}
void* calloc(std::size_t n, std::size_t s) {
  void* p = __libc_calloc(n, s);
  if (counting()) on_alloc(p);
  return p;
}
void* realloc(void* old, std::size_t n) {
  const bool on = counting();
  if (on) on_free(old);
  void* p = __libc_realloc(old, n);
  if (on) on_alloc(p != nullptr ? p : (n == 0 ? nullptr : old));
  return p;
}
void* memalign(std::size_t a, std::size_t n) {
  void* p = __libc_memalign(a, n);
  if (counting()) on_alloc(p);
  return p;
}
void* aligned_alloc(std::size_t a, std::size_t n) { return memalign(a, n); }
int posix_memalign(void** out, std::size_t a, std::size_t n) {
  *out = memalign(a, n);
  return *out == nullptr && n != 0 ? 12 /* ENOMEM */ : 0;
}
}
#endif
