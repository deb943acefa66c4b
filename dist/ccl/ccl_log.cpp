// The collective log: a ring of the last kFlightEntries collectives, kept unformatted (entering
// one costs two clock reads and a few copies under an uncontended lock) and formatted on read.
#include "dist/ccl/ccl_log.hpp"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "src/core/file.hpp"

namespace meshtest::dist {

namespace {

struct Raw {
  std::string_view op;
  std::uint64_t seq = 0;
  Shape shape;
  DType dtype = DType::f32;
  std::array<LogField, 4> fields{};
  std::size_t n = 0;
  std::uint64_t signature = 0;
  std::uint64_t group_seq = 0;
  const std::vector<int>* members = nullptr;  // valid while the collective runs
  std::int64_t start_us = 0;
  std::int64_t end_us = -1;
  perf::FlightState state = perf::FlightState::queued;
};

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string detail_of(const Raw& r) {
  std::string d = fmt::format("{}{}", r.dtype, r.shape);
  for (std::size_t i = 0; i < r.n; ++i) {
    const LogField& f = r.fields[i];
    if (f.text.empty()) {
      fmt::format_to(std::back_inserter(d), " {} {}", f.key, f.value);
    } else {
      fmt::format_to(std::back_inserter(d), " {} {}", f.key, f.text);
    }
  }
  return d;
}

/// The axis as the log's last field holds it ("all" or the number).
std::string axis_of(const Raw& r) {
  if (r.n == 0 || r.fields[r.n - 1].key != "axis") return "?";
  const LogField& f = r.fields[r.n - 1];
  return f.text.empty() ? std::to_string(f.value) : std::string(f.text);
}

struct Log {
  std::mutex mutex;
  std::array<Raw, kFlightEntries> ring{};
  std::uint64_t seq = 0;  // entries made; the current one is ring[(seq - 1) % size]
  std::filesystem::path flight_dir;
  std::string (*activity)() = nullptr;

  Raw& current() { return ring[(seq - 1) % ring.size()]; }
};

Log& log() {
  static Log l;
  return l;
}

}  // namespace

void ccl_log_enter(std::string_view op, const Shape& shape, DType dtype,
                   std::span<const LogField> fields) {
  const std::int64_t start = now_us();
  Log& l = log();
  std::lock_guard lock(l.mutex);
  ++l.seq;
  Raw& r = l.current();
  r.op = op;
  r.seq = l.seq;
  r.shape = shape;
  r.dtype = dtype;
  r.n = std::min(fields.size(), r.fields.size());
  std::copy_n(fields.begin(), r.n, r.fields.begin());
  r.signature = 0;
  r.group_seq = 0;
  r.members = nullptr;
  r.start_us = start;
  r.end_us = -1;
  r.state = perf::FlightState::queued;
}

void ccl_log_agreeing(std::uint64_t signature, std::uint64_t group_seq,
                      const std::vector<int>* members) {
  Log& l = log();
  std::lock_guard lock(l.mutex);
  if (l.seq == 0) return;
  Raw& r = l.current();
  r.signature = signature;
  r.group_seq = group_seq;
  r.members = members;
  r.state = perf::FlightState::waiting;
}

void ccl_log_exit(bool failed) {
  const std::int64_t end = now_us();
  Log& l = log();
  std::lock_guard lock(l.mutex);
  if (l.seq == 0) return;
  Raw& r = l.current();
  r.end_us = end;
  r.members = nullptr;
  r.state = failed ? perf::FlightState::failed : perf::FlightState::done;
}

CollectiveEntry ccl_log_last() {
  Raw r;
  std::vector<int> members;
  {
    Log& l = log();
    std::lock_guard lock(l.mutex);
    if (l.seq > 0) r = l.current();
    // Under the lock: the collective is still running, so its communicator is alive.
    if (r.members != nullptr) members = *r.members;
  }
  CollectiveEntry e{
      .op = std::string(r.op),
      .seq = r.seq,
      .detail = {},
      .completed = r.state == perf::FlightState::done || r.state == perf::FlightState::failed,
      .group_seq = r.group_seq,
      .members = std::move(members)};
  if (!r.op.empty()) e.detail = detail_of(r);
  return e;
}

std::string describe(const CollectiveEntry& e) {
  if (e.op.empty()) return "no collective entered yet";
  return fmt::format("{} #{} {} ({})", e.op, e.seq, e.detail,
                     e.completed ? "completed" : "waiting inside");
}

perf::FlightDump ccl_flight(std::string reason, std::string activity) {
  std::vector<Raw> raws;
  std::string (*source)() = nullptr;
  {
    Log& l = log();
    std::lock_guard lock(l.mutex);
    source = l.activity;
    const std::uint64_t n = std::min<std::uint64_t>(l.seq, l.ring.size());
    for (std::uint64_t s = l.seq - n + 1; s <= l.seq; ++s)
      raws.push_back(l.ring[(s - 1) % l.ring.size()]);
  }
  perf::FlightDump d;
  int up = 0;
  MPI_Initialized(&up);
  int down = 0;
  MPI_Finalized(&down);
  if (up != 0 && down == 0) {
    MPI_Comm_rank(MPI_COMM_WORLD, &d.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d.size);
  } else {
    d.size = 1;
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  d.host = host;
  d.pid = ::getpid();
  d.reason = std::move(reason);
  d.activity = activity.empty() && source != nullptr ? source() : std::move(activity);
  d.time_us = now_us();
  for (const Raw& r : raws) {
    d.entries.push_back({.seq = r.seq,
                         .op = std::string(r.op),
                         .axis = axis_of(r),
                         .group_seq = r.group_seq,
                         .signature = r.signature,
                         .detail = detail_of(r),
                         .bytes = r.shape.numel() * static_cast<std::int64_t>(dtype_size(r.dtype)),
                         .start_us = r.start_us,
                         .end_us = r.end_us,
                         .state = r.state});
  }
  return d;
}

void set_flight_dir(std::filesystem::path dir, std::string (*activity)()) {
  Log& l = log();
  std::lock_guard lock(l.mutex);
  l.flight_dir = std::move(dir);
  l.activity = activity;
}

std::optional<std::filesystem::path> flight_dump(std::string reason, std::string activity) {
  std::filesystem::path dir;
  {
    Log& l = log();
    std::lock_guard lock(l.mutex);
    dir = l.flight_dir;
  }
  if (dir.empty()) return std::nullopt;
  try {
    const perf::FlightDump d = ccl_flight(std::move(reason), std::move(activity));
    const std::string text = perf::flight_json(d);
    const auto bytes = std::as_bytes(std::span(text));
    std::filesystem::create_directories(dir);
    const std::filesystem::path path = dir / fmt::format("rank{}.json", d.rank);
    write_file_atomic(path, std::span(&bytes, 1));
    return path;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace meshtest::dist
