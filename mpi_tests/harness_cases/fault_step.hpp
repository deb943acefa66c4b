// fault_step: what every rank of a fault case's job says in its log, for the launcher to read —
// that it reaches the faulty step, and that it runs its job-end hooks.
#pragma once

#include <cstdio>
#include <string_view>

#include "dist/mesh/job_end.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "mpi_tests/harness_cases/fault_jobs.hpp"

namespace meshtest::harness_cases {

/// "[fault] rank r reaches the collective at <now_ms()>" on stderr (the rank's log), flushed, so
/// that the launcher can time how fast the job ends after the last rank got there.
inline void print_reach() {
  std::fprintf(stderr, "[fault] rank %d reaches the collective at %lld\n",
               dist::world_rank_or_minus_one(), now_ms());
  std::fflush(stderr);
}

/// A job-end hook: "[fault] rank r ran its job-end hooks: <reason>" on stderr.
inline void print_job_end(std::string_view reason) {
  std::fprintf(stderr, "[fault] rank %d ran its job-end hooks: %.*s\n",
               dist::world_rank_or_minus_one(), static_cast<int>(reason.size()), reason.data());
  std::fflush(stderr);
}

/// Registers print_job_end; returns true (for a namespace-scope initializer).
inline bool add_print_job_end() {
  dist::add_job_end_hook(&print_job_end);
  return true;
}

}  // namespace meshtest::harness_cases
