// The node chain (dist/ccl/node_chain.hpp): all_reduce over a group that spans nodes, reduced
// within each node through shared memory and chained between nodes in axis order. On one
// machine the nodes are cut by ShmGroup::set_node_size_for_testing; across simulated hosts
// (label multinode) they are the hosts. Expected values are plain loops over every device's
// input in axis order, in the accumulator type (f32 for bf16 and f16, rounded once): bit for bit,
// each device checking its part of the output, and every output equal to device 0's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/paths/node_chain/node_chain.hpp"
#include "dist/ccl/paths/shm/shm.hpp"
#include "dist/testing/harness/harness.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/scale.hpp"
#include "src/core/random.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

using detail::NodeChain;
using detail::ShmGroup;

int world_size() {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

/// Whether the ranks of comm sit on hosts in consecutive runs of equal length q >= 2, at least
/// two hosts: the layouts the chain takes, by MPI_Get_processor_name (independent of the
/// chain's own MPI_COMM_TYPE_SHARED test).
bool chainable_by_host(MPI_Comm comm) {
  int p = 0;
  MPI_Comm_size(comm, &p);
  std::array<char, MPI_MAX_PROCESSOR_NAME> name{};
  int len = 0;
  MPI_Get_processor_name(name.data(), &len);
  std::vector<char> all(static_cast<std::size_t>(p) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, comm);
  std::vector<std::string> host;
  for (int r = 0; r < p; ++r) host.emplace_back(all.data() + r * MPI_MAX_PROCESSOR_NAME);
  std::vector<int> runs;  // lengths of runs of one host
  std::vector<std::string> seen;
  for (int r = 0; r < p; ++r) {
    if (r > 0 && host[r] == host[r - 1]) {
      ++runs.back();
      continue;
    }
    if (std::find(seen.begin(), seen.end(), host[r]) != seen.end()) return false;  // interleaved
    seen.push_back(host[r]);
    runs.push_back(1);
  }
  return runs.size() >= 2 && runs[0] >= 2 &&
         std::all_of(runs.begin(), runs.end(), [&](int n) { return n == runs[0]; });
}

/// The node sizes to cut this machine into for the test: every q >= 2 with p / q >= 2 nodes
/// of q (and a q that leaves a shorter last node, which has no chain). Empty when the ranks
/// span hosts: there the hosts are the nodes.
std::vector<int> test_node_sizes(int p) {
  if (!ShmGroup::one_node(MPI_COMM_WORLD)) return {};
  std::vector<int> out;
  for (int q = 2; 2 * q <= p + 1; ++q) out.push_back(q);
  return out;
}

/// Cuts the communicators that the meshes made in its scope establish into nodes of q.
class FakeNodes {
 public:
  explicit FakeNodes(int q) { ShmGroup::set_node_size_for_testing(q); }
  FakeNodes(const FakeNodes&) = delete;
  FakeNodes& operator=(const FakeNodes&) = delete;
  ~FakeNodes() { ShmGroup::set_node_size_for_testing(0); }
};

/// A line mesh whose communicator has been established (one agreed all_reduce), with nodes of
/// q (0: the hosts).
MeshDevice established_line(int q) {
  FakeNodes cut(q);
  MeshDevice mesh = MeshDevice::line();
  Tensor one(Shape{1}, DType::i32);
  one.fill(1);
  EXPECT_EQ(all_reduce(mesh, one).item(0), mesh.size());
  return mesh;
}

/// Elements [first, first + count) of device j's input of n elements: normal values scaled by
/// 2^(j % 13) and then by 4^(k % 7) for element k, so that reordering the additions changes the
/// rounding (f16, whose range is narrower, by 2^-14 more: its sums stay finite); integers for
/// the integer dtypes. Counter-based: any part is made without the rest.
Tensor input_part(std::int64_t n, DType t, int j, std::int64_t first, std::int64_t count) {
  const RandomKey key{.seed = 11, .stream = static_cast<std::uint64_t>(j)};
  const Range part{.start = first, .size = count};
  if (!is_floating(t))
    return generate_slice(Shape{n}, 0, part, t, key, Integers{-1000000, 1000000});
  Tensor x = generate_slice(Shape{n}, 0, part, DType::f64, key, Normal{});
  auto v = x.span<double>();
  const double scale = t == DType::f16 ? 0x1p-14 : 1.0;
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t k = first + i;
    v[static_cast<std::size_t>(i)] *=
        scale * static_cast<double>(1 << (j % 13)) * (1 << 2 * (k % 7));
  }
  return x.astype(t);
}

/// Device j's whole input of n elements.
Tensor input(std::int64_t n, DType t, int j) { return input_part(n, t, j, 0, n); }

/// The reduction of every device's input in axis order, in the accumulator type A, stored T.
template <class T, class A>
Tensor reference_as(const std::vector<Tensor>& xs, ReduceOp op) {
  const std::int64_t n = xs[0].numel();
  Tensor out(xs[0].shape(), xs[0].dtype());
  for (std::int64_t k = 0; k < n; ++k) {
    const auto at = static_cast<std::size_t>(k);
    A acc = static_cast<A>(xs[0].span<T>()[at]);
    for (std::size_t j = 1; j < xs.size(); ++j) {
      const A v = static_cast<A>(xs[j].span<T>()[at]);
      if (op == ReduceOp::max) {
        acc = std::max(acc, v);
      } else if (op == ReduceOp::min) {
        acc = std::min(acc, v);
      } else if constexpr (std::is_integral_v<A>) {  // sums wrap
        using U = std::make_unsigned_t<A>;
        acc = static_cast<A>(static_cast<U>(acc) + static_cast<U>(v));
      } else {
        acc += v;
      }
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (op == ReduceOp::avg) acc /= static_cast<A>(xs.size());
    }
    out.span<T>()[at] = static_cast<T>(acc);
  }
  return out;
}

Tensor reference(const std::vector<Tensor>& xs, ReduceOp op) {
  switch (xs[0].dtype()) {
    case DType::f32:
      return reference_as<float, float>(xs, op);
    case DType::f64:
      return reference_as<double, double>(xs, op);
    case DType::bf16:
      return reference_as<bf16, float>(xs, op);
    case DType::f16:
      return reference_as<f16, float>(xs, op);
    case DType::i32:
      return reference_as<std::int32_t, std::int32_t>(xs, op);
    case DType::i64:
      return reference_as<std::int64_t, std::int64_t>(xs, op);
    case DType::u8:
      break;
  }
  ADD_FAILURE() << "no reference for u8";
  return {};
}

/// How much of the dtype x op x size matrix a layout runs: all of it on one layout per test,
/// a cross-section (the bf16 carry, a ragged tail, several chunks) on the others, so that
/// the test stays within the harness's deadline under a sanitizer at 16 ranks on 2 cores.
enum class Coverage { full, cross_section };

/// Checks all_reduce (out of place, in place, and the flat path) of every dtype and op at
/// sizes from one element to several chunks with a ragged tail against reference(). Each device
/// holds its part of the output (elements [n me / p, n (me + 1) / p)) against the reference of
/// that part, made from that part of every device's input, and its whole output against device
/// 0's: together every element of every device's output is checked, and the reference costs as
/// much per device at 16 devices as at 2.
void expect_axis_order_bits(const MeshDevice& mesh, int axis, const NodeChain& chain,
                            Coverage coverage) {
  MPI_Comm comm = mesh.comm(axis);
  int p = 0, me = 0;
  MPI_Comm_size(comm, &p);
  MPI_Comm_rank(comm, &me);
  const bool full = coverage == Coverage::full;
  const std::vector<DType> dtypes =
      full ? std::vector{DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64}
           : std::vector{DType::f32, DType::bf16};
  const std::vector<ReduceOp> ops =
      full ? std::vector{ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}
           : std::vector{ReduceOp::sum, ReduceOp::max};
  for (DType t : dtypes) {
    const std::int64_t per = chain.chunk_elements(t);
    const std::vector<std::int64_t> sizes =
        full ? std::vector<std::int64_t>{1, p + 1, per, 2 * per + 3 * p + 1}
             : std::vector<std::int64_t>{p + 1, 2 * per + 3 * p + 1};
    for (std::int64_t n : sizes) {
      const Tensor x = input(n, t, me);
      const std::int64_t first = n * me / p, count = n * (me + 1) / p - first;
      std::vector<Tensor> parts;  // every device's input, elements [first, first + count)
      for (int j = 0; j < p; ++j) parts.push_back(input_part(n, t, j, first, count));
      for (ReduceOp op : ops) {
        if (op == ReduceOp::avg && !is_floating(t)) continue;
        SCOPED_TRACE(fmt::format("{} {} of {} elements on axis {}, part [{}, {}) checked here", t,
                                 reduce_op_name(op), n, axis, first, first + count));
        const Tensor want = reference(parts, op);
        const std::uint64_t before = chain.calls();
        const Tensor got = all_reduce(mesh, x, {.axis = axis, .op = op});
        EXPECT_EQ(chain.calls(), before + 1) << "the call did not take the chain";
        EXPECT_TRUE(got.slice(0, first, count).bitwise_equal(want)) << "out of place";
        Tensor in_place = x;  // a copy
        all_reduce_inplace(mesh, in_place, {.axis = axis, .op = op});
        EXPECT_TRUE(in_place.bitwise_equal(got)) << "in place, against out of place";
        NodeChain::set_mode(NodeChain::Mode::off);
        const Tensor flat = all_reduce(mesh, x, {.axis = axis, .op = op});
        NodeChain::set_mode(NodeChain::Mode::on);
        EXPECT_EQ(chain.calls(), before + 2) << "turned off, the call still took the chain";
        EXPECT_TRUE(flat.bitwise_equal(got)) << "the flat MPI path, against the chain";
        Tensor first_device = got;
        MPI_Bcast(first_device.bytes(), static_cast<int>(first_device.nbytes()), MPI_BYTE, 0, comm);
        EXPECT_TRUE(got.bitwise_equal(first_device)) << "differs from device 0's output";
      }
    }
  }
}

TEST(CclNodeChain, LayoutDecidesWhetherThereIsAChain) {
  const int p = world_size(), me = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  {  // The hosts as they are.
    const MeshDevice mesh = established_line(0);
    const bool want = chainable_by_host(mesh.comm());
    EXPECT_EQ(NodeChain::find(mesh.comm()) != nullptr, want)
        << "hosts chainable: " << want << " (one host: the shared-memory ring instead)";
    EXPECT_EQ(ShmGroup::find(mesh.comm()) != nullptr, p > 1 && ShmGroup::one_node(mesh.comm()));
  }
  for (int q : test_node_sizes(p)) {
    SCOPED_TRACE(fmt::format("nodes of {} ranks", q));
    const MeshDevice mesh = established_line(q);
    const NodeChain* chain = NodeChain::find(mesh.comm());
    EXPECT_EQ(ShmGroup::find(mesh.comm()), nullptr) << "the group spans (test) nodes";
    if (p % q != 0) {  // a shorter last node: no chain, the flat path
      EXPECT_EQ(chain, nullptr);
      Tensor x = input(1000, DType::f32, me);
      std::vector<Tensor> xs;
      for (int j = 0; j < p; ++j) xs.push_back(input(1000, DType::f32, j));
      EXPECT_TRUE(all_reduce(mesh, x).bitwise_equal(reference(xs, ReduceOp::sum)));
      continue;
    }
    ASSERT_NE(chain, nullptr);
    EXPECT_EQ(chain->nodes(), p / q);
    EXPECT_EQ(chain->node(), me / q);
    EXPECT_EQ(chain->per_node(), q);
    // Automatic: the chain from kAutoPerNode devices a node on; on: always; off: never.
    for (const auto& [mode, taken] :
         {std::pair{NodeChain::Mode::automatic, q >= 4}, std::pair{NodeChain::Mode::on, true},
          std::pair{NodeChain::Mode::off, false}}) {
      NodeChain::set_mode(mode);
      const std::uint64_t before = chain->calls();
      Tensor x = input(1000, DType::f32, me);
      all_reduce(mesh, x);
      EXPECT_EQ(chain->calls(), before + (taken ? 1 : 0))
          << "mode " << NodeChain::show_mode(static_cast<std::int64_t>(mode));
    }
    NodeChain::set_mode(NodeChain::Mode::on);
  }
}

TEST(CclNodeChain, MatchesTheAxisOrderReductionBitForBit) {
  // Every layout of 2 to p / 2 ranks a node, the first of them in full: 16 ranks on 2 cores
  // take about 8 s in Release, several times that under ASan, more than the 60 s default there.
  MESHTEST_TIMEOUT(240);
  const int p = world_size();
  std::vector<int> sizes = test_node_sizes(p);
  sizes.push_back(0);  // the hosts
  bool any = false;
  for (int q : sizes) {
    if (q > 0 && p % q != 0) continue;
    SCOPED_TRACE(q > 0 ? fmt::format("nodes of {} ranks", q) : std::string("the hosts"));
    const MeshDevice mesh = established_line(q);
    const NodeChain* chain = NodeChain::find(mesh.comm());
    if (chain == nullptr) continue;  // the hosts as they are, when they cannot be chained
    // All of the matrix on the first layout with a chain (the most nodes), a cross-section
    // on the rest; above 8 ranks (support/scale.hpp) the cross-section on every layout.
    const bool full = !any && p <= test_support::kFullProductUpTo;
    expect_axis_order_bits(mesh, kAllAxes, *chain, full ? Coverage::full : Coverage::cross_section);
    any = true;
  }
  if (!any) GTEST_SKIP() << "no layout of " << p << " ranks has a chain (needs 2 nodes of 2)";
}

TEST(CclNodeChain, EachAxisOfATwoDimensionalMesh) {
  const int p = world_size();
  if (p % 4 != 0) GTEST_SKIP() << "needs a [2, p/2] mesh whose rows have at least 2 nodes";
  const bool hosts = !ShmGroup::one_node(MPI_COMM_WORLD);
  FakeNodes cut(hosts ? 0 : 2);
  const MeshDevice mesh({2, p / 2});
  bool any = false;
  for (int axis : {0, 1}) {
    Tensor one(Shape{1}, DType::i32);
    one.fill(1);
    all_reduce(mesh, one, {.axis = axis});  // establishes the axis's communicator
    const NodeChain* chain = NodeChain::find(mesh.comm(axis));
    const bool want = hosts ? chainable_by_host(mesh.comm(axis)) : axis == 1 && p / 2 >= 4;
    EXPECT_EQ(chain != nullptr, want) << "axis " << axis;
    if (chain == nullptr) continue;
    any = true;
    expect_axis_order_bits(mesh, axis, *chain, Coverage::cross_section);
  }
  if (!any) GTEST_SKIP() << "no axis of this layout has a chain";
}

TEST(CclNodeChain, DevicesThatDisagreeOnThePathGetTheSameError) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs two devices";
  const int q = test_node_sizes(p).empty() ? 0 : 2;
  const MeshDevice mesh = established_line(p % 2 == 0 ? q : 0);
  const int me = mesh.device_id();
  ccl_test::expect_error(
      mesh, kAllAxes, "the chain turned off on device 0",
      [&] {
        NodeChain::set_mode(me != 0 ? NodeChain::Mode::on : NodeChain::Mode::off);
        try {
          all_reduce(mesh, input(10, DType::f32, me));
        } catch (...) {
          NodeChain::set_mode(NodeChain::Mode::on);
          throw;
        }
        NodeChain::set_mode(NodeChain::Mode::on);
      },
      {"node chain (MESHTEST_CCL_NODE_CHAIN)", "device 0", "0", "1"});
}

/// The tests take the chain whenever a layout has one (MESHTEST_CCL_NODE_CHAIN=1), so that
/// nodes of 2 and 3 devices run it too.
struct ChainOn : ::testing::Environment {
  void SetUp() override { NodeChain::set_mode(NodeChain::Mode::on); }
};
const auto* const kChainOn = ::testing::AddGlobalTestEnvironment(new ChainOn);

}  // namespace
}  // namespace meshtest::dist
