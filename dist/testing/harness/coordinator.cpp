// Rank 0's coordinator: verdict agreement, deadline, lagging-rank detection and the abort report.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dist/mesh/job_end.hpp"
#include "dist/testing/harness/control.hpp"
#include "dist/testing/harness/crash.hpp"
#include "dist/testing/harness/output.hpp"
#include "dist/testing/harness/report.hpp"
#include "dist/testing/harness/verdict.hpp"

namespace meshtest::dist::testing::detail {

namespace {

using namespace std::chrono_literals;

/// After the failure grace, missing ranks are queried this often; one that reports the same
/// unfinished collective twice in a row is stuck.
constexpr Millis kQueryInterval = 500ms;
/// After this many failure graces, missing ranks end the job even if not seen stuck (they may be
/// inside an MPI call that the collective log does not see).
constexpr int kGraceLimit = 5;
/// After a rank ends a test while others have not, they are queried after this long (then
/// every kQueryInterval) for the pass watch.
constexpr Millis kPassGrace = 250ms;
/// How long the abort report waits for the missing ranks' snapshots.
constexpr Millis kSnapshotWait = 2s;
/// Pause between printing the report and MPI_Abort, so the report comes before mpirun's notice.
constexpr Millis kForwardDelay = 300ms;

std::string seconds(Millis t) {
  return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000);
}

class Coordinator {
 public:
  void run() {
    // Polls fast right after a message (the other ranks' arrivals follow the first), and
    // backs off to a few wake-ups per 2 ms while a test runs.
    Backoff backoff(2);
    while (!done_) {
      while (auto m = try_receive(c_.to_root, MPI_ANY_SOURCE, MPI_ANY_TAG)) {
        handle(*m);
        backoff.reset();
        if (done_) {
          return;
        }
      }
      check_deadline();
      check_failure_grace();
      check_pass_watch();
      backoff.pause();
    }
  }

 private:
  void handle(const Message& m) {
    const auto r = static_cast<std::size_t>(m.source);
    if (m.tag == kSnapshot) {
      Snapshot s = decode_snapshot(m.bytes);
      if (s.query == query_id_) {
        latest_[r] = std::move(s);
      }
    } else if (m.tag == kExited) {
      const Exited e = decode_exited(m.bytes);
      end_job(fmt::format("rank {} exited with status {} in {}", m.source, e.code, e.activity),
              e.code != 0 ? e.code : 1);
    } else if (m.tag == kFailed) {
      if (!failed_at_) {
        failed_at_ = Clock::now();
        failed_rank_ = m.source;
      }
    } else if (m.tag == kArrive) {
      on_arrival(m.source, decode_arrival(m.bytes));
    }
  }

  void on_arrival(int rank, Arrival a) {
    for (int r = 0; r < c_.size; ++r) {
      const auto& b = arrivals_[static_cast<std::size_t>(r)];
      if (!b || (b->finish == a.finish && b->index == a.index && b->name == a.name)) {
        continue;
      }
      end_job(fmt::format("ranks ran different tests: rank {} {} but rank {} {}", r, what(*b), rank,
                          what(a)),
              1);
    }
    if (a.status == Status::failed && !failed_at_) {
      failed_at_ = Clock::now();
      failed_rank_ = rank;
    }
    if (!a.finish && !passed_at_) {
      passed_at_ = Clock::now();
    }
    arrivals_[static_cast<std::size_t>(rank)] = std::move(a);
    if (missing().empty()) {
      conclude();
    }
  }

  static std::string what(const Arrival& a) {
    return a.finish ? std::string("finished all its tests")
                    : fmt::format("ended test #{} {}", a.index, a.name);
  }

  /// Every rank arrived: send the verdict, and start the next phase.
  void conclude() {
    std::vector<Arrival> all;
    for (auto& a : arrivals_) {
      all.push_back(std::move(*a));
    }
    const bool finish = all.front().finish;
    const Verdict v = finish ? agree_finish(all) : agree(all);
    restart_clock();  // before rank 0's main thread can start the next test
    const std::string bytes = encode(v);
    for (int r = 0; r < c_.size; ++r) {
      send(c_.from_root, r, kVerdict, bytes);
    }
    arrivals_.assign(static_cast<std::size_t>(c_.size), std::nullopt);
    latest_ = previous_ = arrivals_snapshot_none();
    failed_at_.reset();
    passed_at_.reset();
    done_ = finish;
  }

  void check_deadline() {
    if (Clock::now() < deadline()) {
      return;
    }
    end_job(fmt::format("{} exceeded its deadline of {}", test_name(), seconds(current_timeout())),
            1);
  }

  /// A rank failed and others have not arrived: end the job once they are seen stuck inside a
  /// collective, or after kGraceLimit graces.
  void check_failure_grace() {
    if (!failed_at_) {
      return;
    }
    const auto since = Clock::now() - *failed_at_;
    if (since < c_.failure_grace) {
      return;
    }
    const std::vector<int> lagging = missing();
    if (since >= kGraceLimit * c_.failure_grace) {
      end_job(fmt::format("rank {} failed {} and rank(s) {} did not arrive within {}", failed_rank_,
                          test_name(), rank_list(lagging), seconds(kGraceLimit * c_.failure_grace)),
              1);
    }
    std::vector<int> stuck;
    for (int r : lagging) {
      const auto& p = previous_[static_cast<std::size_t>(r)];
      const auto& l = latest_[static_cast<std::size_t>(r)];
      if (p && l && p->query != l->query && !l->last.op.empty() && !l->last.completed &&
          !p->last.completed && p->last.seq == l->last.seq) {
        stuck.push_back(r);
      }
    }
    if (!stuck.empty()) {
      end_job(fmt::format("rank {} failed {} while other ranks wait inside a collective",
                          failed_rank_, test_name()),
              1);
    }
    if (Clock::now() - last_query_ >= kQueryInterval) {
      previous_ = latest_;
      query(lagging);
    }
  }

  /// A rank ended the test and others have not arrived (none failed: that has its own watch):
  /// query them, and end the job with a desync when one waits inside a collective whose group
  /// holds an arrived rank that never called it. That rank has left the test, so the
  /// collective cannot complete: it skipped one (or the others called one too many). The
  /// communicator is matched by its ranks; an arrived rank with several communicators of the
  /// same ranks is taken to have called it if any of them counts that many calls, so a slow
  /// but correct collective is never called a desync.
  void check_pass_watch() {
    if (!passed_at_ || failed_at_ || Clock::now() - *passed_at_ < kPassGrace) {
      return;
    }
    const std::vector<int> lagging = missing();
    if (query_id_ == 0 || !answered(lagging)) {  // judge a whole round of answers
      if (Clock::now() - last_query_ >= kQueryInterval) {
        previous_ = latest_;
        query(lagging);
      }
      return;
    }
    for (int r : lagging) {
      // Inside the same collective in two rounds of answers, kQueryInterval apart: a rank
      // caught inside a collective it is just leaving is not judged.
      const auto& l = latest_[static_cast<std::size_t>(r)];
      const auto& p = previous_[static_cast<std::size_t>(r)];
      if (!l || l->last.completed || l->last.group_seq == 0 || !p || p->query == l->query ||
          p->last.completed || p->last.seq != l->last.seq) {
        continue;
      }
      for (int m : l->last.members) {
        if (m < 0 || m >= c_.size) {
          continue;
        }
        const auto i = static_cast<std::size_t>(m);
        const Arrival* a = arrivals_[i] ? &*arrivals_[i] : nullptr;
        if (a != nullptr && !a->finish && never_called(*a, l->last)) {
          end_job(skipped_message(m, *a, l->last), 1);
        }
      }
    }
    if (Clock::now() - last_query_ >= kQueryInterval) {
      previous_ = latest_;
      query(lagging);
    }
  }

  static std::uint64_t calls_on(const Arrival& a, const std::vector<int>& members) {
    std::uint64_t most = 0;
    for (const GroupCount& g : a.groups) {
      if (g.members == members) {
        most = std::max(most, g.calls);
      }
    }
    return most;
  }

  static bool never_called(const Arrival& a, const CollectiveEntry& waiting) {
    return calls_on(a, waiting.members) < waiting.group_seq;
  }

  /// "collective desync: rank 2 ended test T after 3 collectives on the group of ranks 0-3,
  /// while ranks 0, 1, 3 wait in all_reduce #6 (collective #4 of that group); ..."
  std::string skipped_message(int rank, const Arrival& a, const CollectiveEntry& waiting) const {
    std::vector<int> waiters;
    for (int r : missing()) {
      const auto& l = latest_[static_cast<std::size_t>(r)];
      if (l && !l->last.completed && l->last.members == waiting.members &&
          l->last.group_seq == waiting.group_seq) {
        waiters.push_back(r);
      }
    }
    return fmt::format(
        "collective desync: rank {} ended test {} ({}) after {} collective(s) on the group of "
        "ranks {}, while rank(s) {} wait in {} (collective #{} of that group); every device of "
        "a group must call the same collectives in the same order",
        rank, a.name, a.status == Status::skipped ? "skipped" : "passed",
        calls_on(a, waiting.members), rank_list(waiting.members), rank_list(waiters),
        describe(waiting), waiting.group_seq);
  }

  /// Asks `ranks` for a snapshot (rank 0 answers in-process); answers land in latest_. With a
  /// `dump` reason, each rank also dumps its flight recorder (snapshot_with_flight).
  void query(const std::vector<int>& ranks, const std::string& dump = {}) {
    ++query_id_;
    last_query_ = Clock::now();
    for (int r : ranks) {
      if (r == 0) {
        latest_[0] = dump.empty() ? snapshot(query_id_) : snapshot_with_flight(query_id_, dump);
      } else {
        send(c_.from_root, r, kQuery, encode_query(query_id_, dump));
      }
    }
  }

  /// Prints one report with fresh snapshots of every rank (their flight recorders dumped) and
  /// the flight recorder's summary, and aborts the job. Every rank runs its job-end hooks
  /// (dist/mesh/job_end.hpp) once its snapshot is taken (rank 0 once the report is out), so
  /// that what they release (a rank stuck inside NCCL) does not change the report.
  [[noreturn]] void end_job(const std::string& reason, int code) {
    disarm_exit_hook();  // MPI_Abort may exit this process through exit()
    std::vector<int> all(static_cast<std::size_t>(c_.size));
    std::iota(all.begin(), all.end(), 0);
    query(all, reason);  // every watchdog answers, then runs its hooks
    const auto until = Clock::now() + kSnapshotWait;
    Backoff backoff;
    while (Clock::now() < until && !answered(all)) {
      if (auto m = try_receive(c_.to_root, MPI_ANY_SOURCE, kSnapshot)) {
        Snapshot s = decode_snapshot(m->bytes);
        if (s.query == query_id_) {
          latest_[static_cast<std::size_t>(m->source)] = std::move(s);
        }
      } else {
        backoff.pause();
      }
    }
    const AbortReport report{.reason = reason,
                             .activity = test_name(),
                             .size = c_.size,
                             .arrivals = arrivals_,
                             .snapshots = latest_};
    write_original_stderr(format_report(report) + flight_summary_of(latest_, c_.size));
    const auto forwarded = Clock::now() + kForwardDelay;  // mpirun forwards the report first
    run_job_end_hooks(reason);
    std::this_thread::sleep_until(forwarded);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();  // not reached
  }

  bool answered(const std::vector<int>& ranks) const {
    for (int r : ranks) {
      const auto& s = latest_[static_cast<std::size_t>(r)];
      if (!s || s->query != query_id_) {
        return false;
      }
    }
    return true;
  }

  std::vector<int> missing() const {
    std::vector<int> out;
    for (int r = 0; r < c_.size; ++r) {
      if (!arrivals_[static_cast<std::size_t>(r)]) {
        out.push_back(r);
      }
    }
    return out;
  }

  /// The test being run: from an arrival if any, else rank 0's activity.
  std::string test_name() const {
    for (const auto& a : arrivals_) {
      if (a && !a->finish) {
        return "test " + a->name;
      }
      if (a) {
        return "the end of the run";
      }
    }
    return activity();
  }

  std::vector<std::optional<Snapshot>> arrivals_snapshot_none() const {
    return std::vector<std::optional<Snapshot>>(static_cast<std::size_t>(c_.size));
  }

  const Config& c_ = config();
  std::vector<std::optional<Arrival>> arrivals_ =
      std::vector<std::optional<Arrival>>(static_cast<std::size_t>(c_.size));
  std::vector<std::optional<Snapshot>> latest_ = arrivals_snapshot_none();
  std::vector<std::optional<Snapshot>> previous_ = arrivals_snapshot_none();
  std::optional<Clock::time_point> failed_at_;
  std::optional<Clock::time_point> passed_at_;  // the first arrival of the running test
  int failed_rank_ = -1;
  std::uint64_t query_id_ = 0;
  Clock::time_point last_query_{};
  bool done_ = false;
};

}  // namespace

void run_coordinator() { Coordinator().run(); }

}  // namespace meshtest::dist::testing::detail
