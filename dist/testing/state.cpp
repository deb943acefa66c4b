// The harness's shared state: current activity, deadline clock and failures so far.
#include "dist/testing/state.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "dist/testing/crash.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist::testing::detail {

namespace {

/// Failures kept per test for snapshots; more are counted, not kept.
constexpr std::size_t kMaxParts = 20;

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
  set_crash_activity(activity);
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
