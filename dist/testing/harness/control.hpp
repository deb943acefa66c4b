// The control thread of each rank: rank 0's coordinator, or a watchdog on the other ranks.
#pragma once

#include "dist/testing/harness/protocol.hpp"

namespace meshtest::dist::testing::detail {

/// Starts this rank's control thread (config() must be set). On rank 0 it is the coordinator:
/// it collects every rank's arrival at the end of each test, sends the agreed verdict, and
/// ends the job with one report (MPI_Abort) when a deadline expires, when ranks lag behind a
/// failed rank inside a collective, or when a rank exits. On other ranks it is a watchdog that
/// answers the coordinator's queries with a snapshot (activity, last collective, failures).
/// Ending a job, every rank's control thread runs the job-end hooks (dist/mesh/job_end.hpp)
/// after its snapshot for the report is taken.
void start_control_thread();

/// Joins the control thread; call after the final verdict (exchange of a finish arrival).
void stop_control_thread();

/// Main thread: sends this rank's arrival to the coordinator and waits for the verdict.
Verdict exchange(const Arrival& arrival);

/// Runs rank 0's coordinator loop until the final verdict is sent (coordinator.cpp).
void run_coordinator();

}  // namespace meshtest::dist::testing::detail
