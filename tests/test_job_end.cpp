// dist/mesh/job_end: the hooks run once, in the order of registration, each once however often
// it was registered; an exception out of one does not stop the next; of concurrent calls only one
// runs them, and a later call none; a null hook and one hook too many are Errors.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dist/mesh/job_end.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dist {
namespace {

std::mutex g_mutex;
std::vector<std::string> g_calls;  // guarded by g_mutex

void called(std::string what) {
  std::lock_guard lock(g_mutex);
  g_calls.push_back(std::move(what));
}

void first(std::string_view reason) { called("first: " + std::string(reason)); }
void throwing(std::string_view) {
  called("throwing");
  throw std::runtime_error("a hook that throws");
}
void third(std::string_view) { called("third"); }
void late(std::string_view) { called("late"); }

TEST(JobEnd, HooksRunOnceInOrderOfRegistration) {
  add_job_end_hook(&first);
  add_job_end_hook(&throwing);
  add_job_end_hook(&first);  // held already: no second run
  add_job_end_hook(&third);

  std::atomic<int> ran{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (run_job_end_hooks("rank 1 failed test T")) ++ran;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ran.load(), 1) << "one of the concurrent calls runs the hooks";
  const std::vector<std::string> once = {"first: rank 1 failed test T", "throwing", "third"};
  EXPECT_EQ(g_calls, once);

  add_job_end_hook(&late);  // after the job ended: never runs
  EXPECT_FALSE(run_job_end_hooks("again"));
  EXPECT_EQ(g_calls, once);
}

template <std::size_t I>
void numbered(std::string_view) {
  called("numbered " + std::to_string(I));
}

template <std::size_t... I>
std::vector<JobEndHook> numbered_hooks(std::index_sequence<I...>) {
  return {&numbered<I>...};
}

TEST(JobEnd, BadHooks) {
  test_support::expect_error([] { add_job_end_hook(nullptr); }, {"add_job_end_hook", "null"});
  // More distinct hooks than the table holds (whatever this process registered before).
  const std::vector<JobEndHook> hooks =
      numbered_hooks(std::make_index_sequence<kMaxJobEndHooks + 1>());
  std::size_t added = 0;
  test_support::expect_error(
      [&] {
        for (JobEndHook h : hooks) {
          add_job_end_hook(h);
          ++added;
        }
      },
      {"at most 16 job-end hooks", "16 are registered"});
  EXPECT_LT(added, hooks.size());
  EXPECT_GE(added, 1U);
  add_job_end_hook(hooks.front());  // held already: no error when full
}

}  // namespace
}  // namespace meshtest::dist
