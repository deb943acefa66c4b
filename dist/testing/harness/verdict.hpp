// The verdict rule: one pass / fail / skip per test, agreed from every rank's result.
#pragma once

#include <string>
#include <vector>

#include "dist/testing/harness/protocol.hpp"

namespace meshtest::dist::testing::detail {

/// The agreed verdict of a test from every rank's arrival (arrivals[r] is rank r's):
/// - failed if any rank failed; parts = every rank's failures, by rank;
/// - else skipped if any rank skipped; parts = the skip of the lowest skipping rank,
///   skipped = every rank that skipped;
/// - else passed.
Verdict agree(const std::vector<Arrival>& arrivals);

/// The exit code of the job from every rank's RUN_ALL_TESTS result: 1 if any is non-zero.
Verdict agree_finish(const std::vector<Arrival>& arrivals);

/// How rank 0 reports a part: "[rank r/N] file:line: Failure\n<message>\n" (gtest's layout,
/// "Skipped" for a skip, "unknown file" when gtest has no location).
std::string format_part(const TestPart& p, int size);

/// "1, 2, 5"
std::string rank_list(const std::vector<int>& ranks);

}  // namespace meshtest::dist::testing::detail
