// The proof of the CCLs' path seam: a path of this test's own, registered from outside dist/
// through the public registry (dist/ccl/path_registry.hpp), that records each exchange it takes
// and delegates to the registered MPI path. Above the built-in paths it takes every host call and
// gives their bits; chosen by name (the option path, MESHTEST_CCL_PATH) it takes the calls named;
// declining, it leaves the call to the next path, or, chosen, ends it with an Error on every
// device; bad names and registrations are Errors naming the paths there are.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/path_registry.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/ccl_paths.hpp"
#include "mpi_tests/support/scoped_env.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;
using ccl_test::path_input;
using detail::Call;
using detail::Path;
using detail::PathInfo;
using detail::ScopedPath;

/// A host path that records the exchanges it takes and moves the data through the MPI path.
class LedgerPath final : public Path {
 public:
  explicit LedgerPath(int priority) : info_{.name = "ledger", .priority = priority} {}
  const PathInfo& info() const override { return info_; }
  bool applies(const Call& /*call*/) const override { return applies_; }

  bool all_gather(Call& call, const detail::AllGatherExchange& x) override {
    return take("all_gather") && ccl_test::registered_path("mpi").all_gather(call, x);
  }
  bool reduce_scatter(Call& call, const detail::ReduceScatterExchange& x) override {
    return take("reduce_scatter") && ccl_test::registered_path("mpi").reduce_scatter(call, x);
  }
  bool all_reduce(Call& call, const detail::AllReduceExchange& x) override {
    return take("all_reduce") && ccl_test::registered_path("mpi").all_reduce(call, x);
  }
  bool all_to_all(Call& call, const detail::AllToAllExchange& x) override {
    return take("all_to_all") && ccl_test::registered_path("mpi").all_to_all(call, x);
  }
  bool broadcast(Call& call, const detail::BroadcastExchange& x) override {
    return take("broadcast") && ccl_test::registered_path("mpi").broadcast(call, x);
  }

  std::string status(MPI_Comm /*comm*/) const override {
    return fmt::format("{} exchanges taken", taken.size());
  }
  std::optional<PathTraffic> traffic(MPI_Comm /*comm*/) const override {
    return PathTraffic{.steps = taken.size()};
  }

  std::vector<std::string> taken;  ///< the exchanges it took
  int asked = 0;                   ///< exchanges it was offered
  bool declines = false;           ///< decline every exchange
  bool applies_ = true;

 private:
  bool take(const char* op) {
    ++asked;
    if (declines) return false;
    taken.emplace_back(op);
    return true;
  }
  PathInfo info_;
};

/// Every collective once on x (each exchange kind: even and uneven pieces, in place and not),
/// with `path` as every call's option.
std::vector<Tensor> every_collective(const MeshDevice& mesh, const Tensor& x,
                                     std::string_view path = {}) {
  const std::int64_t p = mesh.size();
  const Tensor even(Shape{p, 2}, DType::f32);
  std::vector<Tensor> out;
  out.push_back(all_gather(mesh, x, {.dim = 1, .path = path}));
  out.push_back(all_gather(mesh, even, {.dim = 0, .path = path}));
  out.push_back(reduce_scatter(mesh, x, {.dim = 1, .op = ReduceOp::max, .path = path}));
  out.push_back(all_reduce(mesh, x, {.op = ReduceOp::avg, .path = path}));
  out.push_back(x);
  all_reduce_inplace(mesh, out.back(), {.path = path});
  out.push_back(all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 0, .path = path}));
  const std::vector<std::int64_t> counts = split_sizes(x.shape()[1], mesh.size());
  out.push_back(all_to_all_v(mesh, x, counts, {.split_dim = 1, .concat_dim = 1, .path = path}));
  out.push_back(broadcast(mesh, x, {.root = mesh.size() - 1, .path = path}));
  return out;
}

const std::vector<std::string> kEveryExchange{"all_gather", "all_gather", "reduce_scatter",
                                              "all_reduce", "all_reduce", "all_to_all",
                                              "all_to_all", "broadcast"};

void expect_same_bits(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].bitwise_equal(want[i]))
        << "collective " << i << " (" << kEveryExchange[i] << ")";
  }
}

TEST(PathPlugin, AboveTheBuiltInPathsItTakesEveryHostCallWithTheirBits) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  const std::vector<Tensor> want = every_collective(mesh, x);
  LedgerPath ledger(1000);
  {
    const ScopedPath registered(ledger);
    EXPECT_EQ(detail::registered_paths().front(), &ledger);
    expect_same_bits(every_collective(mesh, x), want);
  }
  EXPECT_EQ(ledger.taken, kEveryExchange);
  every_collective(mesh, x);  // unregistered: never asked again
  EXPECT_EQ(ledger.asked, static_cast<int>(kEveryExchange.size()));
}

TEST(PathPlugin, ChosenByNameForOneCallOrForARun) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  const std::vector<Tensor> want = every_collective(mesh, x);
  LedgerPath ledger(0);  // below the MPI path, which takes everything: only a choice reaches it
  const ScopedPath registered(ledger);
  every_collective(mesh, x);
  EXPECT_TRUE(ledger.taken.empty());
  expect_same_bits(every_collective(mesh, x, "ledger"), want);
  EXPECT_EQ(ledger.taken, kEveryExchange);
  ledger.taken.clear();
  {
    const ccl_test::ScopedPathEnv env("ledger");
    expect_same_bits(every_collective(mesh, x), want);
    EXPECT_EQ(ledger.taken, kEveryExchange);
    // The call's option comes first.
    expect_same_bits(every_collective(mesh, x, "mpi"), want);
    EXPECT_EQ(ledger.taken.size(), kEveryExchange.size());
  }
  {
    // A list: the first named path of the operand's memory.
    const ccl_test::ScopedPathEnv env("mpi,ledger");
    every_collective(mesh, x);
    EXPECT_EQ(ledger.taken.size(), kEveryExchange.size());
  }
}

TEST(PathPlugin, TheBuiltInPathsChosenByNameGiveTheSameBits) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  const std::vector<Tensor> want = every_collective(mesh, x, "mpi");
  // The shared-memory path on its own: equal pieces only (it declines the rest), one node of
  // more than one device; elsewhere (one device, or ranks on two hosts) it does not apply.
  const Tensor even(Shape{mesh.size(), 3}, DType::f32);
  const auto shm = [&] { return all_gather(mesh, even, {.dim = 0, .path = "shm"}); };
  if (!ccl_test::shm_ring_expected(mesh)) {
    expect_error(mesh, kAllAxes, "shm where it does not apply", [&] { shm(); },
                 {fmt::format("path shm was chosen (the option path, or MESHTEST_CCL_PATH) and "
                              "does not apply to this call's group of {} device{} (it applies to "
                              "one node",
                              mesh.size(), mesh.size() == 1 ? "" : "s")});
    return;
  }
  EXPECT_TRUE(shm().bitwise_equal(all_gather(mesh, even, {.dim = 0, .path = "mpi"})));
  EXPECT_TRUE(all_reduce(mesh, x, {.path = "shm"}).bitwise_equal(want[4]));
  const Tensor uneven(Shape{1 + mesh.device_id() % 2, 3}, DType::f32);
  expect_error(mesh, kAllAxes, "shm for uneven pieces",
               [&] { all_gather(mesh, uneven, {.dim = 0, .path = "shm"}); },
               {"path shm was chosen (the option path, or MESHTEST_CCL_PATH) and declines this "
                "call; leave the choice to the registry for it (the paths of host memory in "
                "order: shm, node_chain, mpi)"});
}

TEST(PathPlugin, DecliningItLeavesTheCallToTheNextPathOrChosenEndsIt) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  const std::vector<Tensor> want = every_collective(mesh, x);
  LedgerPath ledger(1000);
  ledger.declines = true;
  const ScopedPath registered(ledger);
  expect_same_bits(every_collective(mesh, x), want);
  EXPECT_EQ(ledger.asked, static_cast<int>(kEveryExchange.size()));
  EXPECT_TRUE(ledger.taken.empty());
  expect_error(mesh, kAllAxes, "chosen and declining",
               [&] { all_reduce(mesh, x, {.path = "ledger"}); },
               {"all_reduce on axis all", "path ledger was chosen", "and declines this call"});
  ledger.applies_ = false;
  const int asked = ledger.asked;
  expect_same_bits(every_collective(mesh, x), want);
  EXPECT_EQ(ledger.asked, asked) << "a path that does not apply is not asked";
  expect_error(
      mesh, kAllAxes, "chosen and not applying",
      [&] { all_gather(mesh, x, {.dim = 1, .path = "ledger"}); },
      {"all_gather on axis all", "path ledger was chosen", "does not apply to this call's group"});
}

TEST(PathPlugin, UnknownNamesAndWrongMemoriesAreErrorsNamingThePaths) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  LedgerPath ledger(0);
  const ScopedPath registered(ledger);
  const std::string listed = "ledger (host memory, any group, priority 0)";
  expect_error(mesh, kAllAxes, "an unknown option",
               [&] { all_reduce(mesh, x, {.path = "nosuch"}); },
               {"the option path names 'nosuch', and no path has that name (the paths: shm "
                "(host memory, one node, priority 300), node_chain (host memory, any group, "
                "priority 200), mpi (host memory, any group, priority 100), ",
                listed});
  expect_error(mesh, kAllAxes, "an unknown name in the variable",
               [&] {
                 const ccl_test::ScopedPathEnv env("ledger,nosuch");
                 broadcast(mesh, x, {});
               },
               {"MESHTEST_CCL_PATH is 'ledger,nosuch', and 'nosuch' is no path", listed});
  // A device path named for host memory (the stand-in moves host bytes, never touched here).
  class OnGpu final : public Path {
   public:
    const PathInfo& info() const override {
      static constexpr PathInfo kInfo{.name = "test_gpu", .memory = Memory::Kind::cuda};
      return kInfo;
    }
  } on_gpu;
  const ScopedPath gpu(on_gpu);
  expect_error(mesh, kAllAxes, "a path of another memory",
               [&] { all_reduce(mesh, x, {.path = "test_gpu"}); },
               {"the option path names 'test_gpu', which moves cuda memory, and this call's "
                "operand is in host memory (the paths of host memory: shm, node_chain, mpi, "
                "ledger)"});
  // The variable may name paths of other memories: a host call skips them.
  const ccl_test::ScopedPathEnv env("test_gpu,ledger");
  ledger.taken.clear();
  all_reduce(mesh, x);
  EXPECT_EQ(ledger.taken, std::vector<std::string>{"all_reduce"});
}

TEST(PathPlugin, ReportsNameEveryPathInOrderWithWhatItHoldsAndHasMoved) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  every_collective(mesh, x);  // the group has agreed calls: the shared-memory ring is made
  LedgerPath ledger(1000);
  const ScopedPath registered(ledger);
  every_collective(mesh, x);
  const std::vector<PathReport> reports = path_reports(mesh.comm());
  const bool ring = ccl_test::shm_ring_expected(mesh);
  std::vector<std::string> names;
  for (const PathReport& r : reports) names.push_back(r.name);
  std::vector<std::string> want;
  for (const Path* p : detail::registered_paths()) want.emplace_back(p->name());
  EXPECT_EQ(names, want) << "every registered path, in the order calls try them";
  ASSERT_EQ(names.front(), "ledger");
  EXPECT_EQ(reports.front().status, fmt::format("{} exchanges taken", kEveryExchange.size()));
  ASSERT_TRUE(reports.front().traffic.has_value());
  EXPECT_EQ(reports.front().traffic->steps, kEveryExchange.size());
  for (const PathReport& r : reports) {
    SCOPED_TRACE(r.name);
    if (r.name == "mpi") {
      EXPECT_THAT(r.status, ::testing::HasSubstr("MPI's own collectives"));
      EXPECT_FALSE(r.traffic.has_value()) << "MPI's algorithm moves the bytes, uncounted";
    } else if (r.name == "shm") {
      // One node and more than one device: the ring (made by the calls' first agreement).
      EXPECT_EQ(!r.status.empty(), ring) << r.status;
      EXPECT_EQ(r.traffic.has_value(), ring);
      if (ring && r.traffic.has_value()) {
        EXPECT_GT(r.traffic->steps, 0U) << "the agreement steps of the calls above";
      }
    }
  }
}

TEST(PathPlugin, BadRegistrationsAreErrors) {
  LedgerPath ledger(0);
  const ScopedPath registered(ledger);
  LedgerPath twin(5);
  try {
    detail::register_path(twin);
    ADD_FAILURE() << "a second path named ledger was registered";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("a path named 'ledger' is registered already"));
  }
  class Named final : public Path {
   public:
    explicit Named(std::string_view name) : info_{.name = name} {}
    const PathInfo& info() const override { return info_; }

   private:
    PathInfo info_;
  };
  for (const std::string_view bad : {std::string_view{}, std::string_view{"a,b"}}) {
    Named named(bad);
    EXPECT_THROW(detail::register_path(named), Error) << "'" << bad << "'";
  }
  EXPECT_EQ(detail::find_path("a,b"), nullptr);
  EXPECT_EQ(detail::find_path("ledger"), &ledger);
}

}  // namespace
}  // namespace meshtest::dist
