// The gtest listener that makes each test's verdict the one agreed by all ranks.
#pragma once

namespace meshtest::dist::testing::detail {

/// Replaces gtest's listeners for an MPI run: on rank 0 the default printer stays (without
/// printing failures as they happen: rank 0 prints every rank's failures once, at the end of
/// the test, as "[rank r/N] file:line: ..."); on other ranks the printer and the XML/JSON
/// output are removed. A verdict listener sends each test's result to rank 0's coordinator at
/// the end of the test, waits for the agreed verdict and records it in this rank's gtest result
/// (so rank 0's result, its XML and every rank's RUN_ALL_TESTS reflect the whole job).
void install_listeners();

/// Makes every rank use rank 0's --gtest_random_seed (so --gtest_shuffle orders tests alike).
void agree_on_random_seed();

}  // namespace meshtest::dist::testing::detail
