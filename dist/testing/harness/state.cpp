// The harness's shared state: current activity, deadline clock and failures so far.
#include "dist/testing/harness/state.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "src/core/error.hpp"

namespace meshtest::dist::testing::detail {

namespace {

/// Failures kept per test for snapshots; more are counted, not kept.
constexpr std::size_t kMaxParts = 20;
/// The size of a signal-safe activity buffer, NUL included.
constexpr std::size_t kSignalTextSize = 512;

// Read by the crash handler: plain buffers, double-buffered so that a signal never reads a
// half-written activity. Written under Shared::mutex.
char g_signal_activity[2][kSignalTextSize] = {"before the first test", ""};
std::atomic<int> g_signal_current{0};

struct Shared {
  std::mutex mutex;
  std::string activity = "before the first test";
  Clock::time_point start = Clock::now();
  Millis timeout{60'000};
  std::vector<TestPart> parts;
};

/// Never destroyed: the exit hook reads it after static destructors may have run.
Shared& shared() {
  static Shared* s = new Shared;
  return *s;
}

void set_activity(Shared& s, std::string activity) {
  const int next = 1 - g_signal_current.load();
  const std::size_t n = std::min(activity.size(), kSignalTextSize - 1);
  std::memcpy(g_signal_activity[next], activity.data(), n);
  g_signal_activity[next][n] = '\0';
  g_signal_current.store(next);
  s.activity = std::move(activity);
}

}  // namespace

Config& config() {
  static Config* c = new Config;
  return *c;
}

void begin_test(const std::string& name) {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  set_activity(s, "test " + name);
  s.start = Clock::now();
  s.timeout = config().default_timeout;
  s.parts.clear();
}

void end_test(const std::string& name) {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  set_activity(s, "between tests (after " + name + ")");
  s.parts.clear();
}

void set_timeout(Millis timeout) {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  s.timeout = timeout;
}

void restart_clock() {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  s.start = Clock::now();
  s.timeout = config().default_timeout;
}

void record_part(TestPart part) {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  if (s.parts.size() < kMaxParts) {
    s.parts.push_back(std::move(part));
  }
}

Clock::time_point deadline() {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  return s.start + s.timeout;
}

Millis current_timeout() {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  return s.timeout;
}

std::string activity() {
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  return s.activity;
}

const char* activity_for_signal() { return g_signal_activity[g_signal_current.load()]; }

Snapshot snapshot(std::uint64_t query) {
  Snapshot snap;
  snap.rank = config().rank;
  snap.query = query;
  snap.last = ccl_log_last();
  Shared& s = shared();
  std::lock_guard lock(s.mutex);
  snap.activity = s.activity;
  snap.parts = s.parts;
  return snap;
}

Snapshot snapshot_with_flight(std::uint64_t query, const std::string& reason) {
  Snapshot snap = snapshot(query);
  const perf::FlightDump d = ccl_flight(reason, snap.activity);
  flight_dump(d.reason, d.activity);
  snap.flight = perf::flight_json(d);
  return snap;
}

Millis env_seconds(const char* name, Millis fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    return fallback;
  }
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  MESHTEST_CHECK(errno == 0 && end != text && *end == '\0' && std::isfinite(seconds) &&
                     seconds > 0 && seconds < 1e7,
                 "environment variable {} must be a positive number of seconds, got '{}'", name,
                 text);
  return Millis(static_cast<std::int64_t>(std::ceil(seconds * 1000)));
}

}  // namespace meshtest::dist::testing::detail
