// The raw exchanges on device buffers (dist/gpu/ccl/exchange) against the CPU path: every exchange
// gives exactly the bytes of dist::all_gather / reduce_scatter / all_reduce / all_to_all(_v) /
// broadcast on host copies of the same inputs — f32, bf16, f16, f64 (and i32 for the copies); sum,
// avg, max; uneven and equal blocks; in place — on every group of every mesh shape of the world;
// NCCL's own reductions equal where they must be and within the error model elsewhere; the groups
// of every mesh shape follow its axes (NCCL rank = axis index); bad inputs. Skips every test, with
// the reason, where a rank has no GPU of its own.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/gpu/ccl/exchange.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "src/gpu/device_tensor.hpp"

namespace meshtest::dist::gpu {
namespace {

using meshtest::gpu::DeviceTensor;
using testing::error_message_of;

class GpuExchange : public ::testing::Test {
 protected:
  void SetUp() override { testing::set_test_timeout(std::chrono::seconds(240)); }
};

/// Calls f(mesh, axis, group) for every mesh shape of the world and every axis (kAllAxes, 0, 1).
void for_each_group(const std::function<void(const MeshDevice&, int, NcclGroup&)>& f) {
  for_each_mesh_axis(
      [&](const MeshDevice& mesh, int axis) { f(mesh, axis, MeshNccl::of(mesh).group(axis)); });
}

/// Element counts of the array_split blocks of `rows` rows of `cols` elements over p devices.
std::vector<std::int64_t> row_blocks(std::int64_t rows, std::int64_t cols, int p) {
  std::vector<std::int64_t> counts = split_sizes(rows, p);
  for (std::int64_t& c : counts) c *= cols;
  return counts;
}

/// Runs `run(in, out)` on a device copy of x into a device tensor of out_shape; the result on
/// the host once the group's stream has finished.
Tensor on_gpu(NcclGroup& g, const Tensor& x, const Shape& out_shape,
              const std::function<void(const std::byte*, std::byte*)>& run) {
  const DeviceTensor in = DeviceTensor::from_host(x);
  DeviceTensor out(out_shape, x.dtype(), Tensor::Uninitialized{});
  run(in.bytes(), out.bytes());
  g.synchronize("the test's exchange");
  return out.to_host();
}

/// Runs `run(buffer)` in place on a device copy of x; the whole buffer back on the host.
Tensor in_place(NcclGroup& g, const Tensor& x, const std::function<void(std::byte*)>& run) {
  DeviceTensor buf = DeviceTensor::from_host(x);
  run(buf.bytes());
  g.synchronize("the test's exchange");
  return buf.to_host();
}

constexpr DType kFloats[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
constexpr DType kCopies[] = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32};
constexpr Reduce kOps[] = {Reduce::sum, Reduce::avg, Reduce::max};

/// Shapes whose rows split unevenly over most p (p*5+3) and evenly (p*4).
std::vector<Shape> reduce_shapes(int p) {
  return {Shape{p * 5 + 3, 7}, Shape{p * 4, 6}, Shape{p * 1024 + 1, 96}};
}

// With a GPU per rank: the whole mesh's group and each axis group, NCCL rank = axis index.
TEST_F(GpuExchange, MeshGroupsFollowTheMeshAxes) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (int rows = 1; rows <= n; ++rows) {
    if (n % rows != 0) continue;
    const MeshDevice mesh({rows, n / rows});
    SCOPED_TRACE(mesh.str());
    MeshNccl& nccl = MeshNccl::of(mesh);
    EXPECT_EQ(&nccl, &MeshNccl::of(mesh)) << "made once per mesh";
    EXPECT_EQ(nccl.device(), bound_gpu());
    for (int axis : {kAllAxes, 0, 1}) {
      NcclGroup& g = nccl.group(axis);
      EXPECT_EQ(g.size(), mesh.axis_size(axis)) << "axis " << axis;
      EXPECT_EQ(g.index(), mesh.axis_index(axis)) << "axis " << axis;
      int count = 0, rank = 0, device = 0;
      {
        NcclLock lock("test");
        MESHTEST_NCCL(ncclCommCount(g.comm(), &count), g.comm());
        MESHTEST_NCCL(ncclCommUserRank(g.comm(), &rank), g.comm());
        MESHTEST_NCCL(ncclCommCuDevice(g.comm(), &device), g.comm());
      }
      EXPECT_EQ(count, g.size());
      EXPECT_EQ(rank, g.index());
      EXPECT_EQ(device, bound_gpu());
      EXPECT_EQ(&g, &nccl.group(axis)) << "split once per axis";
    }
    MESHTEST_EXPECT_ERROR(nccl.group(2), "mesh axis 2 out of range");
  }
}

TEST_F(GpuExchange, ReduceScatterHasTheCpuPathsBits) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    const int p = g.size(), me = g.index();
    for (const Shape& s : reduce_shapes(p)) {
      const auto counts = row_blocks(s[0], s[1], p);
      const Range own = split_range(s[0], p, me);
      for (DType t : kFloats) {
        for (Reduce op : kOps) {
          const std::string what =
              fmt::format("reduce_scatter {} {} {}", t, s, reduce_op_name(reduce_op_of(op)));
          const Tensor x = term(s, t, mesh.device_id());
          const Tensor want =
              dist::reduce_scatter(mesh, x, {.dim = 0, .axis = axis, .op = reduce_op_of(op)});
          expect_bits(want,
                      on_gpu(g, x, want.shape(),
                             [&](const std::byte* in, std::byte* out) {
                               reduce_scatter(g, in, counts, out, t, op);
                             }),
                      what);
          const std::size_t at = static_cast<std::size_t>(own.start * s[1]) * dtype_size(t);
          const Tensor buf =
              in_place(g, x, [&](std::byte* b) { reduce_scatter(g, b, counts, b + at, t, op); });
          expect_bits(want, buf.slice(0, own), what + " in place");
        }
      }
    }
  });
}

TEST_F(GpuExchange, AllReduceHasTheCpuPathsBits) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    for (const Shape& s : reduce_shapes(g.size())) {
      for (DType t : kFloats) {
        for (Reduce op : kOps) {
          const std::string what =
              fmt::format("all_reduce {} {} {}", t, s, reduce_op_name(reduce_op_of(op)));
          const Tensor x = term(s, t, mesh.device_id());
          const Tensor want = dist::all_reduce(mesh, x, {.axis = axis, .op = reduce_op_of(op)});
          expect_bits(want,
                      on_gpu(g, x, s,
                             [&](const std::byte* in, std::byte* out) {
                               all_reduce(g, in, out, s.numel(), t, op);
                             }),
                      what);
          expect_bits(want,
                      in_place(g, x, [&](std::byte* b) { all_reduce(g, b, b, s.numel(), t, op); }),
                      what + " in place");
        }
      }
    }
  });
}

TEST_F(GpuExchange, NcclNumericsAreExactWhereOrderCannotMatterAndBoundedElsewhere) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    const int p = g.size();
    for (const Shape& s : reduce_shapes(p)) {
      const auto counts = row_blocks(s[0], s[1], p);
      const Shape own = s.with(0, split_range(s[0], p, g.index()).size);
      expect_nccl_numerics(mesh, axis, s, 0, [&](const Tensor& x, ReduceOp op) {
        const Tensor ar = on_gpu(g, x, s, [&](const std::byte* in, std::byte* out) {
          all_reduce(g, in, out, s.numel(), x.dtype(), reduce_of(op), Numerics::nccl);
        });
        const Tensor rs = on_gpu(g, x, own, [&](const std::byte* in, std::byte* out) {
          reduce_scatter(g, in, counts, out, x.dtype(), reduce_of(op), Numerics::nccl);
        });
        return std::pair(ar, rs);
      });
    }
  });
}

TEST_F(GpuExchange, AllGatherHasTheCpuPathsBits) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    const int p = g.size(), me = g.index();
    for (std::int64_t rows : {std::int64_t{3} * p + 2, std::int64_t{3} * p}) {
      const auto counts = row_blocks(rows, 5, p);
      const Range own = split_range(rows, p, me);
      for (DType t : kCopies) {
        const std::string what = fmt::format("all_gather {} of {} rows", t, rows);
        const Tensor piece = term(Shape{own.size, 5}, t, mesh.device_id());
        const Tensor want = dist::all_gather(mesh, piece, {.dim = 0, .axis = axis});
        expect_bits(
            want,
            on_gpu(g, piece, want.shape(),
                   [&](const std::byte* in, std::byte* out) { all_gather(g, in, counts, out, t); }),
            what);
        if (rows % p != 0) continue;  // in place: equal pieces (ncclAllGather)
        Tensor full(want.shape(), t);
        full.assign_slice(0, own.start, piece);
        const std::size_t at = static_cast<std::size_t>(own.start * 5) * dtype_size(t);
        expect_bits(want,
                    in_place(g, full, [&](std::byte* b) { all_gather(g, b + at, counts, b, t); }),
                    what + " in place");
      }
    }
  });
}

TEST_F(GpuExchange, AllToAllHasTheCpuPathsBits) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    const int p = g.size(), me = g.index();
    const std::int64_t rows = 2 * p + 1;
    const auto send = row_blocks(rows, 3, p);
    const std::vector<std::int64_t> recv(static_cast<std::size_t>(p),
                                         send[static_cast<std::size_t>(me)]);
    for (DType t : kCopies) {
      const Tensor x = term(Shape{rows, 3}, t, mesh.device_id());
      const Tensor want =
          dist::all_to_all(mesh, x, {.split_dim = 0, .concat_dim = 0, .axis = axis});
      expect_bits(want,
                  on_gpu(g, x, want.shape(),
                         [&](const std::byte* in, std::byte* out) {
                           all_to_all(g, in, send, out, recv, t);
                         }),
                  fmt::format("all_to_all {}", t));
    }
  });
}

TEST_F(GpuExchange, AllToAllVHasTheCpuPathsBits) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    const int p = g.size(), me = g.index();
    // Device i sends (i + 2j) % 3 rows to device j: some blocks empty, none alike.
    std::vector<std::int64_t> send_rows, send, recv;
    std::int64_t rows = 0;
    for (int j = 0; j < p; ++j) {
      send_rows.push_back((me + 2 * j) % 3);
      send.push_back(send_rows.back() * 4);
      recv.push_back((j + 2 * me) % 3 * 4);
      rows += send_rows.back();
    }
    for (DType t : kCopies) {
      const Tensor x = term(Shape{rows, 4}, t, mesh.device_id());
      const Tensor want = dist::all_to_all_v(mesh, x, send_rows, {.axis = axis});
      expect_bits(want,
                  on_gpu(g, x, want.shape(),
                         [&](const std::byte* in, std::byte* out) {
                           all_to_all(g, in, send, out, recv, t);
                         }),
                  fmt::format("all_to_all_v {}", t));
    }
  });
}

TEST_F(GpuExchange, BroadcastHasTheCpuPathsBits) {
  for_each_group([](const MeshDevice& mesh, int axis, NcclGroup& g) {
    const int p = g.size(), root = p - 1;
    const Shape s{p + 2, 3};
    for (DType t : kCopies) {
      const Tensor x = term(s, t, mesh.device_id());
      const Tensor want = dist::broadcast(mesh, x, {.root = root, .axis = axis});
      expect_bits(want,
                  on_gpu(g, x, s,
                         [&](const std::byte* in, std::byte* out) {
                           broadcast(g, in, out, s.numel(), t, root);
                         }),
                  fmt::format("broadcast {}", t));
      expect_bits(want,
                  in_place(g, x, [&](std::byte* b) { broadcast(g, b, b, s.numel(), t, root); }),
                  fmt::format("broadcast {} in place", t));
    }
  });
}

TEST_F(GpuExchange, BadInputIsAnErrorBeforeAnythingIsQueued) {
  for_each_group([](const MeshDevice&, int, NcclGroup& g) {
    const int p = g.size();
    DeviceTensor buf(Shape{4 * p}, DType::i32);
    std::byte* b = buf.bytes();
    const std::vector<std::int64_t> wrong(static_cast<std::size_t>(p + 1), 1);
    const std::vector<std::int64_t> negative(static_cast<std::size_t>(p), -1);
    const std::vector<std::int64_t> fours(static_cast<std::size_t>(p), 4);
    const std::vector<std::pair<std::string, std::function<void()>>> cases = {
        {fmt::format("reduce_scatter: {} block counts for a group of {} devices", p + 1, p),
         [&] { reduce_scatter(g, b, wrong, b, DType::i32, Reduce::sum); }},
        {"all_gather: block 0 has -1 elements", [&] { all_gather(g, b, negative, b, DType::i32); }},
        {"all_reduce: reduce op max is not supported for dtype u8",
         [&] { all_reduce(g, b, b, 4, DType::u8, Reduce::max); }},
        {"reduce_scatter: reduce op avg is not supported for dtype i32",
         [&] { reduce_scatter(g, b, fours, b, DType::i32, Reduce::avg, Numerics::nccl); }},
        {fmt::format("broadcast: root {} out of range [0, {})", p, p),
         [&] { broadcast(g, b, b, 4, DType::i32, p); }},
        {"all_reduce: the input is null but must hold 16 bytes",
         [&] { all_reduce(g, nullptr, b, 4, DType::i32, Reduce::sum); }},
    };
    for (const auto& [needle, f] : cases) {
      const std::string err = error_message_of(f);
      EXPECT_NE(err.find(needle), std::string::npos)
          << "'" << needle << "' not in: '" << err << "'";
    }
    // Nothing was queued: the group still runs an exchange.
    Tensor ones(Shape{p}, DType::i32);
    ones.fill(1);
    const Tensor got = on_gpu(g, ones, ones.shape(), [&](const std::byte* in, std::byte* out) {
      all_reduce(g, in, out, p, DType::i32, Reduce::sum);
    });
    EXPECT_EQ(got.item(0), p) << "the group is out of step";
    EXPECT_FALSE(g.broken());
  });
}

}  // namespace
}  // namespace meshtest::dist::gpu
