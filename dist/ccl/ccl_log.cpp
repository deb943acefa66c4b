// The last-collective record read by the harness watchdog: kept unformatted, formatted on read.
#include "dist/ccl/ccl_log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

namespace meshtest::dist {

namespace {
struct Raw {
  std::string_view op;
  std::uint64_t seq = 0;
  Shape shape;
  DType dtype = DType::f32;
  std::array<LogField, 4> fields{};
  std::size_t n = 0;
  bool completed = false;
};
std::mutex g_mutex;
Raw g_last;
}  // namespace

void ccl_log_enter(std::string_view op, const Shape& shape, DType dtype,
                   std::span<const LogField> fields) {
  std::lock_guard lock(g_mutex);
  g_last.op = op;
  g_last.shape = shape;
  g_last.dtype = dtype;
  g_last.n = std::min(fields.size(), g_last.fields.size());
  std::copy_n(fields.begin(), g_last.n, g_last.fields.begin());
  g_last.completed = false;
  ++g_last.seq;
}

void ccl_log_exit() {
  std::lock_guard lock(g_mutex);
  g_last.completed = true;
}

CollectiveEntry ccl_log_last() {
  Raw r;
  {
    std::lock_guard lock(g_mutex);
    r = g_last;
  }
  CollectiveEntry e{.op = std::string(r.op), .seq = r.seq, .detail = {}, .completed = r.completed};
  if (r.op.empty()) return e;
  e.detail = fmt::format("{}{}", r.dtype, r.shape);
  for (std::size_t i = 0; i < r.n; ++i) {
    const LogField& f = r.fields[i];
    if (f.text.empty()) {
      fmt::format_to(std::back_inserter(e.detail), " {} {}", f.key, f.value);
    } else {
      fmt::format_to(std::back_inserter(e.detail), " {} {}", f.key, f.text);
    }
  }
  return e;
}

std::string describe(const CollectiveEntry& e) {
  if (e.op.empty()) return "no collective entered yet";
  return fmt::format("{} #{} {} ({})", e.op, e.seq, e.detail,
                     e.completed ? "completed" : "waiting inside");
}

}  // namespace meshtest::dist
