// agree_or_throw / check_and_agree: a bad input on some ranks makes every rank throw the same
// message naming the lowest failing rank; no bad input returns everywhere; all_ranks is an AND.
#include <gtest/gtest.h>

#include <string>

#include "dist/mesh/agree.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;

TEST(MeshAgree, NoErrorReturnsOnEveryRank) {
  const MeshDevice mesh = MeshDevice::line();
  EXPECT_NO_THROW(agree_or_throw(mesh.comm(), ""));
  EXPECT_NO_THROW(check_and_agree(mesh.comm(), "step", [] {}));
}

TEST(MeshAgree, LastRankFailsAllThrowItsMessage) {
  const MeshDevice mesh = MeshDevice::line();
  const int n = mesh.size(), last = n - 1;
  const std::string mine = mesh.device_id() == last ? "bad shape [3, 4] on the last rank" : "";
  expect_error(mesh, kAllAxes, "agree_or_throw", [&] { agree_or_throw(mesh.comm(), mine); },
               {fmt::format("device {} of {} rejected its input: bad shape [3, 4] on the last rank",
                            last, n)});
}

TEST(MeshAgree, LowestFailingRankIsNamed) {
  const MeshDevice mesh = MeshDevice::line();
  const int n = mesh.size();
  // Every rank but rank 0 fails (at np 1, rank 0 fails), each with its own message.
  const int lowest = n == 1 ? 0 : 1;
  const std::string mine =
      mesh.device_id() >= lowest ? fmt::format("error of rank {}", mesh.device_id()) : "";
  expect_error(
      mesh, kAllAxes, "lowest", [&] { agree_or_throw(mesh.comm(), mine); },
      {fmt::format("device {} of {} rejected its input: error of rank {}", lowest, n, lowest)});
}

TEST(MeshAgree, CheckAndAgreeOnAnAxis) {
  const int world = MeshDevice::line().size();
  const int rows = world % 2 == 0 ? 2 : 1;  // two row groups that each agree on their own
  const MeshDevice mesh({rows, world / rows});
  const int n = mesh.axis_size(1), last = n - 1;
  expect_error(mesh, 1, "check_and_agree",
               [&] {
                 check_and_agree(mesh.comm(1), "my step", [&] {
                   MESHTEST_CHECK(mesh.axis_index(1) != last, "clip is {}, expected > 0", -1);
                 });
               },
               {fmt::format("device {} of {} rejected its input: my step: clip is -1, expected > 0",
                            last, n)});
}

TEST(MeshAgree, AllRanksIsAnAnd) {
  const MeshDevice mesh = MeshDevice::line();
  EXPECT_TRUE(all_ranks(mesh.comm(), true));
  EXPECT_FALSE(all_ranks(mesh.comm(), mesh.device_id() != mesh.size() - 1));
}

}  // namespace
}  // namespace meshtest::dist
