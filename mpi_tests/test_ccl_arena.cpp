// The node arena (dist/ccl/arena/arena.hpp) and the shared-memory path's in-place collectives
// over it: on every mesh shape and axis, each CCL on arena tensors (read where they lie) equals
// the same call on heap tensors (through the slots) bit for bit, with multi-chunk messages and
// random floats, and moves no input bytes through the window; a group where one device passes a
// heap tensor takes the slots on every device; a disagreement gives the full error and stays in
// step; all_reduce writing every output in place in one step; the arena's allocator (holes
// merged, a full arena named), and what stays in it; the copies, against memcpy.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dist/ccl/arena/arena.hpp"
#include "dist/ccl/ccl.hpp"
#include "dist/ccl/copy.hpp"
#include "dist/ccl/paths/shm/shm.hpp"
#include "dist/testing/harness/fixtures.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/scale.hpp"
#include "src/core/random.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::dist {
namespace {

using detail::ShmGroup;

/// The job's arena (16 MiB per device), opened by the first test that asks (every rank runs
/// every test, so every rank asks at the same point).
NodeArena& arena() {
  NodeArena* a = NodeArena::get();
  return a != nullptr ? *a : NodeArena::open(std::size_t{16} << 20);
}

/// x's copy in the arena.
Tensor in_arena(const Tensor& x) {
  Tensor a(x.shape(), x.dtype(), arena());
  if (x.nbytes() > 0) std::memcpy(a.bytes(), x.bytes(), x.nbytes());
  return a;
}

/// Bytes this device has written into its window slots on `comm` so far (0 without a group).
std::uint64_t written(MPI_Comm comm) {
  const ShmGroup* g = ShmGroup::find(comm);
  return g != nullptr ? g->traffic().written : 0;
}

/// Random values of `t` (integers for integer types), different on every device.
Tensor random_input(const Shape& s, DType t, int device, std::uint64_t seed) {
  const Tensor r = random_normal(
      s, DType::f32, {.seed = seed, .stream = 100 + static_cast<std::uint64_t>(device)});
  if (t == DType::i32) {
    Tensor i(s, DType::i32);
    for (std::int64_t k = 0; k < s.numel(); ++k)
      i.span<std::int32_t>()[static_cast<std::size_t>(k)] =
          static_cast<std::int32_t>(r.item(k) * 100);
    return i;
  }
  return r.astype(t);
}

/// Steps of 4 KiB (MESHTEST_CCL_SHM_CHUNK, read when a communicator's group is made): several
/// chunks in messages of a few hundred KiB, at every rank count.
class CclArena : public testing::MeshShapeTest {
 protected:
  void SetUp() override {
    setenv("MESHTEST_CCL_SHM_CHUNK", "4096", 1);
    MeshShapeTest::SetUp();
  }
  void TearDown() override {
    MeshShapeTest::TearDown();
    unsetenv("MESHTEST_CCL_SHM_CHUNK");
  }
};

/// Runs `ccl` on the heap input x and on its arena copy, on `axis`: the results must be equal
/// bit for bit; the arena call must write no input bytes into the window (`max_written`: what
/// it may write, all_reduce's reduced parts) when the group has a window, and the heap call
/// must write some, unless it is an all_to_all of contiguous `alltoall_block`-byte blocks that
/// the window leaves to MPI (ShmGroup::window_all_to_all).
void expect_same(const MeshDevice& mesh, int axis, const std::string& what, const Tensor& x,
                 const std::function<Tensor(const Tensor&)>& ccl, std::uint64_t max_written = 0,
                 std::size_t alltoall_block = 0) {
  SCOPED_TRACE(fmt::format("{} on axis {} of {}", what, axis, mesh.str()));
  const MPI_Comm comm = mesh.comm(axis);
  const Tensor heap = ccl(x);  // (makes the group on the first call)
  const std::uint64_t w0 = written(comm);
  const Tensor heap2 = ccl(x);
  const std::uint64_t w1 = written(comm);
  const Tensor got = ccl(in_arena(x));
  const std::uint64_t w2 = written(comm);
  EXPECT_TRUE(got.bitwise_equal(heap)) << "arena result differs from the window path's";
  EXPECT_TRUE(heap2.bitwise_equal(heap));
  const ShmGroup* g = ShmGroup::find(comm);
  if (g == nullptr) return;  // one device, or the path off: nothing to count
  if (alltoall_block == 0 || g->window_all_to_all(alltoall_block, false)) {
    EXPECT_GT(w1 - w0, 0U) << "the heap call moved nothing through the window";
  }
  EXPECT_LE(w2 - w1, max_written) << "the arena call copied its input into the window";
}

TEST_P(CclArena, EveryCclInPlaceEqualsTheWindowPath) {
  arena();
  for (const int axis : {kAllAxes, 0, 1}) {
    const int p = axis == kAllAxes ? mesh().size() : mesh().axis_size(axis);
    const int me = axis == kAllAxes ? mesh().device_id() : mesh().axis_index(axis);
    // Every dtype up to 8 devices; f32 above (the scale runs keep CI's time).
    const std::vector<DType> types = p <= 8
                                         ? std::vector<DType>{DType::f32, DType::bf16, DType::i32}
                                         : std::vector<DType>{DType::f32};
    for (const DType t : types) {
      SCOPED_TRACE(fmt::format("{}", t));
      const std::int64_t n = 3 * 4096 * p / static_cast<std::int64_t>(dtype_size(t)) + 5;
      const Tensor flat = random_input(Shape{n}, t, me, 1);
      const std::uint64_t part = static_cast<std::uint64_t>((n + p - 1) / p) * dtype_size(t);
      expect_same(
          mesh(), axis, "all_reduce sum", flat,
          [&](const Tensor& x) { return all_reduce(mesh(), x, {.axis = axis}); }, part + 4096);
      expect_same(
          mesh(), axis, "all_reduce max", flat,
          [&](const Tensor& x) {
            return all_reduce(mesh(), x, {.axis = axis, .op = ReduceOp::max});
          },
          part + 4096);
      // In place on an arena tensor the output is in the arena too: each device writes its
      // reduced part straight into the others' outputs.
      expect_same(
          mesh(), axis, "all_reduce_inplace", flat,
          [&](const Tensor& x) {
            Tensor y = x.resource() != nullptr ? in_arena(x) : x;  // a copy would be heap
            all_reduce_inplace(mesh(), y, {.axis = axis});
            return y;
          },
          static_cast<std::uint64_t>(p - 1) * part);
      const Tensor piece = random_input(Shape{3 * 1024 + 1, 3}, t, me, 2);
      for (const int dim : {0, 1}) {
        expect_same(
            mesh(), axis, fmt::format("all_gather dim {}", dim), piece,
            [&](const Tensor& x) { return all_gather(mesh(), x, {.dim = dim, .axis = axis}); });
      }
      const Tensor blocks = random_input(Shape{p * 2048, 3}, t, me, 3);
      expect_same(mesh(), axis, "reduce_scatter dim 0", blocks, [&](const Tensor& x) {
        return reduce_scatter(mesh(), x, {.dim = 0, .axis = axis});
      });
      expect_same(
          mesh(), axis, "all_to_all 0 -> 0", blocks,
          [&](const Tensor& x) {
            return all_to_all(mesh(), x, {.split_dim = 0, .concat_dim = 0, .axis = axis});
          },
          0, blocks.nbytes() / static_cast<std::size_t>(p));
      expect_same(mesh(), axis, "all_to_all 0 -> 1", blocks, [&](const Tensor& x) {
        return all_to_all(mesh(), x, {.split_dim = 0, .concat_dim = 1, .axis = axis});
      });
    }
  }
}

/// Sets the process's default memory resource for its lifetime (outputs in the arena).
class DefaultResource {
 public:
  explicit DefaultResource(MemoryResource* r) : before_(default_memory_resource()) {
    set_default_memory_resource(r);
  }
  DefaultResource(const DefaultResource&) = delete;
  DefaultResource& operator=(const DefaultResource&) = delete;
  ~DefaultResource() { set_default_memory_resource(before_); }

 private:
  MemoryResource* before_;
};

std::uint64_t steps(MPI_Comm comm) {
  const ShmGroup* g = ShmGroup::find(comm);
  return g != nullptr ? g->traffic().steps : 0;
}

TEST_P(CclArena, AllReduceWritesEveryOutputInTheArenaInOneStep) {
  // With inputs and outputs in the arena, each device reduces its part of the whole message and
  // writes it into every output: the agreement step and one more, however many chunks the
  // message spans, and the window path's bits. One device's heap output sends every device
  // back to the slots.
  NodeArena& a = arena();
  for (const int axis : {kAllAxes, 0, 1}) {
    const int p = axis == kAllAxes ? mesh().size() : mesh().axis_size(axis);
    const int me = axis == kAllAxes ? mesh().device_id() : mesh().axis_index(axis);
    const MPI_Comm comm = mesh().comm(axis);
    for (const DType t : {DType::f32, DType::bf16, DType::i32}) {
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        SCOPED_TRACE(
            fmt::format("{} {} on axis {} of {}", t, reduce_op_name(op), axis, mesh().str()));
        const std::int64_t n = 5 * 4096 * p / static_cast<std::int64_t>(dtype_size(t)) + 3;
        const Tensor x = random_input(Shape{n}, t, me, 11);
        const Tensor want = all_reduce(mesh(), x, {.axis = axis, .op = op});  // the slots
        const Tensor xa = in_arena(x);
        // out = all_reduce of xa with the outputs in the arena on the devices `mine` says.
        const auto to = [&](bool mine) {
          DefaultResource outputs(mine ? &a : nullptr);
          return all_reduce(mesh(), xa, {.axis = axis, .op = op});
        };
        const std::uint64_t s0 = steps(comm);
        const Tensor got = to(true);
        const std::uint64_t s1 = steps(comm);
        Tensor inplace = in_arena(x);
        all_reduce_inplace(mesh(), inplace, {.axis = axis, .op = op});
        const std::uint64_t s2 = steps(comm);
        const Tensor mixed = to(me != p - 1);  // the last device's output on the heap
        const std::uint64_t s3 = steps(comm);
        EXPECT_TRUE(a.offset_of(got.bytes(), got.nbytes()).has_value()) << "output in the arena";
        EXPECT_TRUE(got.bitwise_equal(want)) << "out of place";
        EXPECT_TRUE(inplace.bitwise_equal(want)) << "in place";
        EXPECT_TRUE(mixed.bitwise_equal(want)) << "one heap output";
        if (ShmGroup::find(comm) != nullptr) {
          EXPECT_EQ(s1 - s0, 2U) << "out of place: the agreement and one step";
          EXPECT_EQ(s2 - s1, 2U) << "in place: the agreement and one step";
          EXPECT_GT(s3 - s2, 3U) << "one heap output: the slots, a step per chunk";
        }
      }
    }
  }
}

TEST_P(CclArena, LargeOutputsAreWrittenStreamingAndStayExact) {
  // Outputs of kStreamOutput bytes and more are written with streaming stores (copy.hpp): an
  // odd element count, so the copies have unaligned heads and tails.
  arena();
  const int p = mesh().size(), me = mesh().device_id();
  if (mesh().rows() != 1) {
    GTEST_SKIP() << "every call is on the axis of all devices, the same group on every shape: "
                    "it runs on the 1 x p mesh";
  }
  const std::int64_t n = static_cast<std::int64_t>(detail::kStreamOutput / 4) + 7 * p + 3;
  const Tensor flat = random_input(Shape{n}, DType::f32, me, 8);
  expect_same(
      mesh(), kAllAxes, "all_reduce", flat, [&](const Tensor& x) { return all_reduce(mesh(), x); },
      static_cast<std::uint64_t>(n) * 4);
  expect_same(
      mesh(), kAllAxes, "all_reduce_inplace", flat,
      [&](const Tensor& x) {
        Tensor y = x.resource() != nullptr ? in_arena(x) : x;
        all_reduce_inplace(mesh(), y);  // every output in the arena: streamed into the others'
        return y;
      },
      static_cast<std::uint64_t>(n) * 4);
  const Tensor piece = random_input(Shape{n / p}, DType::f32, me, 9);
  expect_same(mesh(), kAllAxes, "all_gather", piece,
              [&](const Tensor& x) { return all_gather(mesh(), x); });
  const Tensor blocks = random_input(Shape{p * (n / p)}, DType::f32, me, 10);
  expect_same(
      mesh(), kAllAxes, "all_to_all", blocks,
      [&](const Tensor& x) { return all_to_all(mesh(), x, {.split_dim = 0, .concat_dim = 0}); }, 0,
      blocks.nbytes() / static_cast<std::size_t>(p));
}

TEST_P(CclArena, StridedInputsTakeTheSlotsAndStayRight) {
  // reduce_scatter along dim 1 packs its input first, all_to_all split along dim 1 reads
  // strided blocks: both go through the slots, on every device alike, with arena inputs too.
  arena();
  const int p = mesh().size(), me = mesh().device_id();
  const Tensor x = random_input(Shape{5, p * 700}, DType::f32, me, 4);
  const Tensor a = in_arena(x);
  EXPECT_TRUE(
      reduce_scatter(mesh(), a, {.dim = 1}).bitwise_equal(reduce_scatter(mesh(), x, {.dim = 1})));
  EXPECT_TRUE(all_to_all(mesh(), a, {.split_dim = 1, .concat_dim = 0})
                  .bitwise_equal(all_to_all(mesh(), x, {.split_dim = 1, .concat_dim = 0})));
}

TEST_P(CclArena, OneHeapInputSendsEveryDeviceThroughTheSlots) {
  arena();
  const int p = mesh().size(), me = mesh().device_id();
  if (p == 1) GTEST_SKIP() << "needs two devices";
  const Tensor x = random_input(Shape{p * 4096 + 3}, DType::f32, me, 5);
  const Tensor want = all_reduce(mesh(), x);
  const std::uint64_t w0 = written(mesh().comm());
  // The last device passes a heap tensor, the others arena tensors.
  const Tensor got = all_reduce(mesh(), me == p - 1 ? x : in_arena(x));
  EXPECT_TRUE(got.bitwise_equal(want));
  if (ShmGroup::find(mesh().comm()) != nullptr) {
    EXPECT_GE(written(mesh().comm()) - w0,
              x.nbytes() * static_cast<std::size_t>(p - 1) / static_cast<std::size_t>(p))
        << "this device read in place while another went through the slots";
  }
}

TEST_P(CclArena, DisagreementOnArenaInputsGivesTheFullErrorAndStaysInStep) {
  arena();
  const int p = mesh().size(), me = mesh().device_id();
  if (p == 1) GTEST_SKIP() << "needs two devices";
  const Tensor good = in_arena(random_input(Shape{p * 4096}, DType::f32, me, 6));
  all_reduce(mesh(), good);  // the group exists
  const Tensor bad = in_arena(random_input(Shape{me == p - 1 ? 5 : 4}, DType::f32, me, 7));
  ccl_test::expect_error(mesh(), kAllAxes, "shape differs on the last device",
                         [&] { all_reduce(mesh(), bad); },
                         {"shapes disagree", fmt::format("device {}", p - 1)});
  EXPECT_TRUE(all_reduce(mesh(), good).bitwise_equal(all_reduce(mesh(), Tensor(good))));
}

// Every mesh shape; above 8 ranks the lines and the squarest shapes (support/scale.hpp).
MESHTEST_INSTANTIATE_MESH_SHAPES_AT_SCALE(CclArena);

TEST(CclCopy, StreamingAndPiecewiseCopiesEqualMemcpy) {
  // Every head alignment, lengths around the vector loop's edges, and the 1-63 byte gaps
  // modulo a page that copy_bytes copies in pieces. Copies within one process: the first
  // device checks them, the others would only repeat it.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::vector<std::byte> src(3 << 20), dst(src.size() + 8192), want(dst.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 131 + 7);
  for (const std::size_t len : {0UL, 1UL, 63UL, 255UL, 256UL, 257UL, 4096UL, 100000UL, 2UL << 20}) {
    for (const std::size_t off : {0UL, 1UL, 15UL, 16UL, 17UL, 48UL, 4095UL}) {
      std::fill(dst.begin(), dst.end(), std::byte{0});
      std::fill(want.begin(), want.end(), std::byte{0});
      std::memcpy(want.data() + off, src.data() + 3, len);
      detail::copy_streaming(dst.data() + off, src.data() + 3, len);
      EXPECT_EQ(dst, want) << "copy_streaming of " << len << " bytes at offset " << off;
      std::fill(dst.begin(), dst.end(), std::byte{0});
      detail::copy_bytes(dst.data() + off, src.data() + 3, len);
      EXPECT_EQ(dst, want) << "copy_bytes of " << len << " bytes at offset " << off;
    }
  }
  std::fill(dst.begin(), dst.end(), std::byte{0});
  detail::copy_in_pieces(dst.data() + 16, src.data(), 300000);
  EXPECT_EQ(std::memcmp(dst.data() + 16, src.data(), 300000), 0);
}

TEST(NodeArenaAllocator, HolesMergeAndAFullArenaIsNamed) {
  NodeArena& a = arena();
  const std::size_t before = a.in_use();
  {
    Tensor x(Shape{1000}, DType::f32, a);  // 4000 bytes -> 4032 (64-byte units)
    Tensor y(Shape{10}, DType::f64, a);
    EXPECT_EQ(x.resource(), &a);
    EXPECT_EQ(a.in_use(), before + 4032 + 128);
    EXPECT_TRUE(a.offset_of(x.bytes(), x.nbytes()).has_value());
    EXPECT_EQ(Tensor(x).resource(), nullptr) << "a copy is a heap tensor";
    EXPECT_EQ(x.slice(0, 0, 10).resource(), nullptr);
    Tensor moved = std::move(y);
    EXPECT_EQ(moved.resource(), &a) << "a move stays in the arena";
    Tensor heap(Shape{4}, DType::f32);
    EXPECT_FALSE(a.offset_of(heap.bytes(), heap.nbytes()).has_value());
  }
  EXPECT_EQ(a.in_use(), before);
  // Freed holes merge: the whole free space is one hole again, so the largest tensor fits.
  const std::size_t room = a.capacity() - before;
  { Tensor big(Shape{static_cast<std::int64_t>(room)}, DType::u8, a); }
  test_support::expect_error(
      [&] { Tensor t(Shape{static_cast<std::int64_t>(room) + 1}, DType::u8, a); },
      {"node arena: no room for", "open it larger"});
  EXPECT_EQ(a.in_use(), before);
}

TEST(NodeArenaAllocator, UseForAllTensorsPutsEveryNewTensorThereAndFallsBackToTheHeap) {
  // What MESHTEST_CCL_ARENA does for a whole test binary (test_ccl_in_arena, ...): tensors that
  // name no resource, ops' results and copies included, lie in the arena while it has room.
  NodeArena& a = arena();
  MemoryResource* before = default_memory_resource();
  NodeArena::use_for_all_tensors();
  {
    const MeshDevice mesh = MeshDevice::line();
    Tensor x(Shape{4096}, DType::f32);
    x.fill(1);
    EXPECT_TRUE(a.offset_of(x.bytes(), x.nbytes()).has_value());
    const Tensor copy = x;
    EXPECT_TRUE(a.offset_of(copy.bytes(), copy.nbytes()).has_value());
    const Tensor y = all_gather(mesh, x);  // (the group exists after the first call)
    const std::uint64_t w1 = written(mesh.comm());
    const Tensor z = all_gather(mesh, x);
    EXPECT_TRUE(a.offset_of(y.bytes(), y.nbytes()).has_value()) << "the output too";
    EXPECT_EQ(written(mesh.comm()) - w1, 0U) << "read in place";
    EXPECT_TRUE(z.bitwise_equal(y));
    // No room: the heap.
    Tensor big(Shape{static_cast<std::int64_t>(a.capacity())}, DType::u8);
    EXPECT_FALSE(a.offset_of(big.bytes(), 1).has_value());
  }
  set_default_memory_resource(before);
}

TEST(NodeArenaAllocator, OpeningTwiceIsAnErrorEverywhere) {
  arena();
  test_support::expect_error([] { NodeArena::open(1 << 20); }, {"an arena is already open"});
}

}  // namespace
}  // namespace meshtest::dist
