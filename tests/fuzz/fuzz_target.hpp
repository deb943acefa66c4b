// The contract of a fuzz target (tests/fuzz/<target>.cpp): the parser, fed arbitrary bytes,
// returns a result that keeps its invariants or throws meshtest::Error. Anything else (another
// exception, a broken invariant, a sanitizer report, a timeout) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

#include "src/core/error.hpp"

/// libFuzzer's entry point, defined by each target (MESHTEST_FUZZ_TARGET) and called by
/// libFuzzer or by the replay driver (replay_main.cpp).
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace meshtest::fuzz {

/// One fuzz input.
struct Input {
  const std::uint8_t* data;
  std::size_t size;

  std::span<const std::byte> bytes() const {
    return {reinterpret_cast<const std::byte*>(data), size};
  }
  std::string_view text() const { return {reinterpret_cast<const char*>(data), size}; }
};

/// Reports a broken invariant (a result the parser should not have returned) and aborts.
[[noreturn]] inline void broken(std::string_view invariant) {
  std::fprintf(stderr, "fuzz: invariant broken: %.*s\n", static_cast<int>(invariant.size()),
               invariant.data());
  std::abort();
}

/// Aborts, naming the invariant, when `ok` is false.
inline void require(bool ok, std::string_view invariant) {
  if (!ok) broken(invariant);
}

/// Runs `f`, which must not throw Error (e.g. re-reading what the writer made of a parsed
/// result); aborts with the error's message if it does.
template <class F>
decltype(auto) must(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    broken(e.what());
  }
}

/// Keeps the bytes of a result alive to the optimizer: every byte is read.
inline void touch(std::span<const std::byte> b) {
  std::uint64_t sum = 0;
  for (std::byte x : b) sum = sum * 31 + std::to_integer<std::uint64_t>(x);
  [[maybe_unused]] volatile std::uint64_t sink = sum;
}

/// Runs one input through `body`; an Error is the expected way to reject it. Other exceptions
/// propagate: libFuzzer (and the replay driver) report them.
inline void run(void (*body)(const Input&), const std::uint8_t* data, std::size_t size) {
  try {
    body(Input{data, size});
  } catch (const Error&) {
  }
}

}  // namespace meshtest::fuzz

/// Defines LLVMFuzzerTestOneInput around the body that follows:
///   MESHTEST_FUZZ_TARGET(in) { use in.bytes() or in.text() }
#define MESHTEST_FUZZ_TARGET(input)                                                   \
  static void meshtest_fuzz_body(const ::meshtest::fuzz::Input& input);               \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    ::meshtest::fuzz::run(meshtest_fuzz_body, data, size);                            \
    return 0;                                                                         \
  }                                                                                   \
  static void meshtest_fuzz_body(const ::meshtest::fuzz::Input& input)
