// Atomic file writes: a temp file beside the target, then rename.
#include "src/core/file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "src/core/error.hpp"

namespace meshtest {

void write_file_atomic(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> parts) {
  static std::atomic<unsigned> counter{0};
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp.{}.{}", ::getpid(), counter++);
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MESHTEST_CHECK(out.good(), "cannot write '{}': cannot create temp file '{}': {}", path.string(),
                   tmp.string(), std::strerror(errno));
    for (const auto& part : parts) {
      out.write(reinterpret_cast<const char*>(part.data()),
                static_cast<std::streamsize>(part.size()));
    }
    out.close();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      fail("cannot write '{}': writing temp file '{}' failed", path.string(), tmp.string());
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    fail("cannot write '{}': rename from '{}' failed: {}", path.string(), tmp.string(),
         ec.message());
  }
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MESHTEST_CHECK(in.good(), "cannot read '{}': no such file or not readable", path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace meshtest
