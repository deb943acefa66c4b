// The collectives on DeviceTensors (dist/gpu/ccl/ccl.hpp) against the CPU path: every CCL gives
// exactly the bits of the host call on host copies of the same inputs — f32, bf16, f16, f64 (and
// i32 for the copies); sum, avg, max; uneven splits; dims 0 and not leading (blocks packed on the
// GPU); in place — on the whole mesh and both axes of every mesh shape of the world; the table's
// cases (dist/ccl/cases.hpp) give their closed forms; NCCL's numerics (the option and
// MESHTEST_GPU_REDUCE) equal where order cannot matter and within the error model elsewhere; bad
// inputs and desyncs are the same Error on every device, before NCCL, and the mesh stays in step.
// The bitwise checks use terms whose sums change bits in another order: a reduction in another
// order fails them wherever a group has 3 devices or more. Skips every test, with the reason,
// where a rank has no GPU of its own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dist/ccl/cases.hpp"
#include "dist/ccl/ccl.hpp"
#include "dist/gpu/ccl/ccl.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/scoped_env.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;
using gpu::expect_bits;
using gpu::for_each_mesh_axis;
using gpu::term;
using test_support::ScopedEnv;

class GpuCcl : public ::testing::Test {
 protected:
  void SetUp() override { testing::set_test_timeout(std::chrono::seconds(300)); }

 private:
  // The tests choose the numerics themselves, whatever the job's environment says.
  const ScopedEnv numerics_{"MESHTEST_GPU_REDUCE", std::nullopt};
};

constexpr DType kFloats[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
constexpr DType kCopies[] = {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

DeviceTensor on_gpu(const Tensor& x) { return DeviceTensor::from_host(x); }

/// This device's size of n split over the axis group (array_split: uneven unless p divides n).
std::int64_t my_part(const MeshDevice& mesh, int axis, std::int64_t n) {
  return split_range(n, mesh.axis_size(axis), mesh.axis_index(axis)).size;
}

TEST_F(GpuCcl, AllReduceHasTheCpuPathsBits) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis);
    for (const Shape& s : {Shape{p * 5 + 3, 7}, Shape{p * 1024 + 1, 96}, Shape{3}}) {
      for (DType t : kFloats) {
        for (ReduceOp op : kOps) {
          const std::string what = fmt::format("all_reduce {}{} {}", t, s, reduce_op_name(op));
          const Tensor x = term(s, t, mesh.device_id());
          const Tensor want = all_reduce(mesh, x, {.axis = axis, .op = op});
          expect_bits(want, all_reduce(mesh, on_gpu(x), {.axis = axis, .op = op}).to_host(), what);
          DeviceTensor in_place = on_gpu(x);
          all_reduce_inplace(mesh, in_place, {.axis = axis, .op = op, .numerics = Numerics::exact});
          expect_bits(want, in_place.to_host(), what + " in place");
        }
      }
    }
  });
}

TEST_F(GpuCcl, ReduceScatterHasTheCpuPathsBits) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis);
    // Uneven and even blocks along dim 0 (contiguous) and dims 1 and -1 (packed on the GPU).
    const std::pair<int, Shape> cases[] = {{0, Shape{p * 5 + 3, 7}},
                                           {0, Shape{p * 1024 + 1, 96}},
                                           {1, Shape{3, 2 * p + 1, 5}},
                                           {1, Shape{2, 4 * p, 3}},
                                           {-1, Shape{4, 3, p + 2}}};
    for (const auto& [dim, s] : cases) {
      for (DType t : kFloats) {
        for (ReduceOp op : kOps) {
          const ReduceScatterOptions opt{.dim = dim, .axis = axis, .op = op};
          const Tensor x = term(s, t, mesh.device_id());
          expect_bits(reduce_scatter(mesh, x, opt), reduce_scatter(mesh, on_gpu(x), opt).to_host(),
                      fmt::format("reduce_scatter {}{} dim {} {}", t, s, dim, reduce_op_name(op)));
        }
      }
    }
  });
}

/// Pairs (a_0, a_1) of t whose sums sit on the edges of t's rounding: ties to even and just
/// past them, subnormals, zeros of both signs, the overflow threshold; each pair in both orders.
std::vector<std::pair<double, double>> edge_pairs(DType t) {
  struct Format {
    int bits;  // significand bits, the leading one included
    int emax;  // exponent of the largest binade
    int emin;  // exponent of the least normal binade
  };
  const Format f = t == DType::bf16  ? Format{8, 127, -126}
                   : t == DType::f16 ? Format{11, 15, -14}
                   : t == DType::f32 ? Format{24, 127, -126}
                                     : Format{53, 1023, -1022};
  const double half_ulp = std::ldexp(1.0, -f.bits);  // of 1
  const double past = half_ulp * (1 + std::ldexp(1.0, 1 - f.bits));
  const double tiny = std::ldexp(1.0, f.emin - f.bits + 1), small = std::ldexp(1.0, f.emin);
  const double big = std::ldexp(2 - std::ldexp(1.0, 1 - f.bits), f.emax);
  const double big_half_ulp = std::ldexp(1.0, f.emax - f.bits);  // big + this ties to infinity
  const std::vector<std::pair<double, double>> pairs = {{1, half_ulp},
                                                        {1 + 2 * half_ulp, half_ulp},
                                                        {1, past},
                                                        {-1, -half_ulp},
                                                        {tiny, tiny},
                                                        {-tiny, tiny},
                                                        {3 * tiny, -tiny},
                                                        {small, -tiny},
                                                        {0.0, -0.0},
                                                        {-0.0, -0.0},
                                                        {big, big},
                                                        {-big, -big},
                                                        {big, -big},
                                                        {big, big_half_ulp / 2},
                                                        {big, big_half_ulp},
                                                        {1.5, -3.0},
                                                        {small * 3, tiny * 5}};
  std::vector<std::pair<double, double>> both = pairs;
  for (const auto& [a, b] : pairs) both.emplace_back(b, a);
  return both;
}

TEST_F(GpuCcl, SumsKeepTheCpuPathsBitsAtTheEdgesOfRounding) {
  // Over two devices the default sum is NCCL's own call (one addition per element, in either
  // order); over more it is the exact path's kernel. Both give the CPU path's bits.
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int me = mesh.axis_index(axis);
    for (DType t : kFloats) {
      std::vector<double> v;
      for (const auto& [a, b] : edge_pairs(t)) v.push_back(me % 2 == 0 ? a : b);
      const auto n = static_cast<std::int64_t>(v.size());
      const Tensor x = Tensor::from_vector(Shape{n}, v).astype(t);
      const Tensor want = all_reduce(mesh, x, {.axis = axis});
      const std::string what = fmt::format("sum of {} edge values", t);
      expect_bits(want, all_reduce(mesh, on_gpu(x), {.axis = axis}).to_host(),
                  "all_reduce " + what);
      const Range own = split_range(n, mesh.axis_size(axis), me);
      expect_bits(want.slice(0, own), reduce_scatter(mesh, on_gpu(x), {.axis = axis}).to_host(),
                  "reduce_scatter " + what);
      // A NaN term gives a NaN sum on both paths; over two devices its payload and sign are
      // NCCL's (the default NaN), not the CPU path's (docs/gpu.md).
      const double nan = std::numeric_limits<double>::quiet_NaN();
      // Element 0: a NaN on the first device; 1: on the last; 2: on every device.
      const bool last = me == mesh.axis_size(axis) - 1;
      const Tensor with_nan =
          Tensor::from_vector(Shape{3},
                              std::vector<double>{me == 0 ? -nan : 1.0, last ? nan : 2.0, nan})
              .astype(t);
      const Tensor sums = all_reduce(mesh, on_gpu(with_nan), {.axis = axis}).to_host();
      const Tensor wide = sums.astype(DType::f64);
      for (const double v : wide.span<double>()) {
        EXPECT_TRUE(std::isnan(v))
            << "a sum with a NaN term is " << v << " (" << fmt::format("{}", t) << ")";
      }
    }
  });
}

TEST_F(GpuCcl, AllGatherHasTheCpuPathsBits) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis);
    for (const std::int64_t n : {std::int64_t{3} * p + 2, std::int64_t{3} * p}) {
      const std::int64_t k = my_part(mesh, axis, n);  // this device's piece along the dim
      const std::pair<int, Shape> cases[] = {
          {0, Shape{k, 5}}, {1, Shape{3, k, 2}}, {-1, Shape{2, 3, k}}};
      for (const auto& [dim, s] : cases) {
        for (DType t : kCopies) {
          const AllGatherOptions opt{.dim = dim, .axis = axis};
          const Tensor x = term(s, t, mesh.device_id());
          expect_bits(all_gather(mesh, x, opt), all_gather(mesh, on_gpu(x), opt).to_host(),
                      fmt::format("all_gather {}{} dim {} of {}", t, s, dim, n));
        }
      }
    }
  });
}

TEST_F(GpuCcl, AllToAllHasTheCpuPathsBits) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis);
    const Shape s{2 * p + 1, 3 * p + 1, p + 2};  // uneven along every dim for most p
    for (const auto& [split, concat] : {std::pair(0, 0), std::pair(1, 1), std::pair(2, 2),
                                        std::pair(0, 1), std::pair(1, 0), std::pair(-1, 0)}) {
      for (DType t : kCopies) {
        const AllToAllOptions opt{.split_dim = split, .concat_dim = concat, .axis = axis};
        const Tensor x = term(s, t, mesh.device_id());
        expect_bits(all_to_all(mesh, x, opt), all_to_all(mesh, on_gpu(x), opt).to_host(),
                    fmt::format("all_to_all {}{} split {} concat {}", t, s, split, concat));
      }
    }
  });
}

TEST_F(GpuCcl, AllToAllVHasTheCpuPathsBits) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), me = mesh.axis_index(axis);
    // Device i sends (i + 2j) % 3 entries to device j: some blocks empty, none alike.
    std::vector<std::int64_t> counts;
    std::int64_t n = 0;
    for (int j = 0; j < p; ++j) {
      counts.push_back((me + 2 * j) % 3);
      n += counts.back();
    }
    for (const auto& [dim, s] : {std::pair(0, Shape{n, 3, 2}), std::pair(1, Shape{3, n, 2})}) {
      for (DType t : kCopies) {
        const AllToAllOptions opt{.split_dim = dim, .concat_dim = dim, .axis = axis};
        const Tensor x = term(s, t, mesh.device_id());
        expect_bits(all_to_all_v(mesh, x, counts, opt),
                    all_to_all_v(mesh, on_gpu(x), counts, opt).to_host(),
                    fmt::format("all_to_all_v {}{} dim {}", t, s, dim));
      }
    }
  });
}

TEST_F(GpuCcl, BroadcastHasTheCpuPathsBits) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), me = mesh.axis_index(axis);
    for (const int root : {0, p - 1}) {
      for (DType t : kCopies) {
        const Tensor x = term(Shape{p + 2, 3}, t, mesh.device_id());
        const BroadcastOptions opt{.root = root, .axis = axis};
        // The other devices' x is not read: they pass none.
        expect_bits(broadcast(mesh, x, opt),
                    broadcast(mesh, me == root ? on_gpu(x) : DeviceTensor(), opt).to_host(),
                    fmt::format("broadcast {} from {}", t, root));
      }
    }
  });
}

/// The table's run of c, on this device's input on the GPU.
DeviceTensor run_case(const MeshDevice& mesh, const DeviceTensor& x, const CclCall& c) {
  switch (c.op) {
    case CclOp::all_gather:
      return all_gather(mesh, x, {.dim = c.dim, .axis = c.axis});
    case CclOp::reduce_scatter:
      return reduce_scatter(mesh, x, {.dim = c.dim, .axis = c.axis, .op = c.reduce});
    case CclOp::all_reduce:
      return all_reduce(mesh, x, {.axis = c.axis, .op = c.reduce});
    case CclOp::all_to_all:
      return all_to_all(mesh, x, {.split_dim = c.dim, .concat_dim = c.concat_dim, .axis = c.axis});
    case CclOp::all_to_all_v: {
      const auto row =
          std::span(c.counts).subspan(static_cast<std::size_t>(mesh.axis_index(c.axis) * c.p()),
                                      static_cast<std::size_t>(c.p()));
      return all_to_all_v(mesh, x, row,
                          {.split_dim = c.dim, .concat_dim = c.concat_dim, .axis = c.axis});
    }
    case CclOp::broadcast:
      return broadcast(mesh, x, {.root = c.root, .axis = c.axis});
  }
  fail("no CCL case {}", static_cast<int>(c.op));
}

TEST_F(GpuCcl, TableCasesGiveTheirClosedForms) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), me = mesh.axis_index(axis);
    for (const CclCase& cc : ccl_cases()) {
      for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
        CclCall c{.op = cc.op,
                  .dtype = t,
                  .reduce = is_floating(t) ? ReduceOp::avg : ReduceOp::sum,
                  .axis = axis,
                  .devices = axis_group(mesh, axis, mesh.device_id()),
                  .shape = Shape{3, 2 * p + 1, 2},
                  .dim = 1,
                  .concat_dim = 1,
                  .root = p - 1};
        for (int j = 0; j < p; ++j) {
          c.sizes.push_back(j + 1);  // all_gather and all_to_all: unequal pieces
          for (int i = 0; i < p; ++i) c.counts.push_back((i + 2 * j) % 3);
        }
        if (cc.op == CclOp::all_to_all) c.sizes.clear();  // split along dim: agreed sizes
        const Tensor got = run_case(mesh, on_gpu(cc.input(c, me)), c).to_host();
        expect_bits(cc.expected(c, me), got, fmt::format("{} {}", cc.name, t));
      }
    }
  });
}

TEST_F(GpuCcl, NcclNumericsAreExactWhereOrderCannotMatterAndBoundedElsewhere) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis);
    for (const auto& [dim, s] :
         {std::pair(0, Shape{p * 5 + 3, 7}), std::pair(1, Shape{3, 2 * p + 1, 5})}) {
      gpu::expect_nccl_numerics(mesh, axis, s, dim, [&](const Tensor& x, ReduceOp op) {
        const DeviceTensor d = on_gpu(x);
        const AllReduceOptions ar{.axis = axis, .op = op, .numerics = Numerics::nccl};
        const ReduceScatterOptions rs{
            .dim = dim, .axis = axis, .op = op, .numerics = Numerics::nccl};
        return std::pair(all_reduce(mesh, d, ar).to_host(), reduce_scatter(mesh, d, rs).to_host());
      });
    }
  });
}

TEST_F(GpuCcl, TheVariableChoosesTheNumericsAndTheOptionWins) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const Tensor x = term(Shape{mesh.axis_size(axis) * 5 + 3, 7}, DType::bf16, mesh.device_id(), 2);
    const DeviceTensor d = on_gpu(x);
    const Tensor cpu = all_reduce(mesh, x, {.axis = axis});
    // NCCL reduces alike when called alike (its algorithm follows the size and the group).
    const Tensor nccl = all_reduce(mesh, d, {.axis = axis, .numerics = Numerics::nccl}).to_host();
    {
      const ScopedEnv env("MESHTEST_GPU_REDUCE", "nccl");
      expect_bits(nccl, all_reduce(mesh, d, {.axis = axis}).to_host(), "MESHTEST_GPU_REDUCE=nccl");
      expect_bits(cpu, all_reduce(mesh, d, {.axis = axis, .numerics = Numerics::exact}).to_host(),
                  "numerics exact over MESHTEST_GPU_REDUCE=nccl");
    }
    {
      const ScopedEnv env("MESHTEST_GPU_REDUCE", "exact");
      expect_bits(cpu, all_reduce(mesh, d, {.axis = axis}).to_host(), "MESHTEST_GPU_REDUCE=exact");
    }
    const ScopedEnv unset("MESHTEST_GPU_REDUCE", std::nullopt);
    expect_bits(cpu, all_reduce(mesh, d, {.axis = axis}).to_host(), "MESHTEST_GPU_REDUCE unset");
  });
}

TEST_F(GpuCcl, BadInputsAndDesyncsAreErrorsOnEveryDeviceBeforeNccl) {
  for_each_mesh_axis([](const MeshDevice& mesh, int axis) {
    const int p = mesh.axis_size(axis), me = mesh.axis_index(axis);
    const Shape s{2 * p, 3};
    const DeviceTensor x = on_gpu(term(s, DType::f32, mesh.device_id()));
    expect_error(mesh, axis, "a dim out of range",
                 [&] { all_gather(mesh, x, {.dim = 2, .axis = axis}); },
                 {fmt::format("dim 2 out of range [-2, 2) for x f32{} on cuda:", s)});
    expect_error(mesh, axis, "avg of integers",
                 [&] {
                   all_reduce(mesh, on_gpu(term(s, DType::i32, 0)),
                              {.axis = axis, .op = ReduceOp::avg});
                 },
                 {"reduce op avg is not supported for dtype i32"});
    const std::vector<std::int64_t> too_many(static_cast<std::size_t>(p + 1), 0);
    expect_error(
        mesh, axis, "send_counts of another length",
        [&] { all_to_all_v(mesh, x, too_many, {.axis = axis}); },
        {fmt::format("send_counts has {} entries but the axis group has {} devices", p + 1, p)});
    {
      const ScopedEnv env("MESHTEST_GPU_REDUCE", "fast");
      expect_error(mesh, axis, "a bad MESHTEST_GPU_REDUCE",
                   [&] { reduce_scatter(mesh, x, {.axis = axis}); },
                   {"MESHTEST_GPU_REDUCE is 'fast'; expected exact (the default) or nccl"});
    }
    const int gpus = meshtest::gpu::device_count();
    if (gpus > 1) {
      // This rank's tensor on another GPU: on the last device of the group only.
      DeviceTensor elsewhere = x;
      if (me == p - 1) {
        const meshtest::gpu::DeviceGuard other((gpu::bound_gpu() + 1) % gpus);
        elsewhere = on_gpu(term(s, DType::f32, 0));
      }
      const int last = axis_group(mesh, axis, mesh.device_id())[static_cast<std::size_t>(p - 1)];
      expect_error(mesh, axis, "a tensor on another GPU",
                   [&] { all_reduce(mesh, elsewhere, {.axis = axis}); },
                   {fmt::format("device {} (axis index {}): x f32{} on cuda:", last, p - 1, s),
                    "is not on this rank's GPU, cuda:"});
    }
    if (p > 1) {
      const bool last = me == p - 1;
      expect_error(mesh, axis, "another collective on one device",
                   [&] {
                     if (me == 0) {
                       all_gather(mesh, x, {.axis = axis});
                     } else {
                       all_reduce(mesh, x, {.axis = axis});
                     }
                   },
                   {"collective desync", "called all_gather", "called all_reduce"});
      expect_error(mesh, axis, "another shape on one device",
                   [&] {
                     all_reduce(mesh, last ? on_gpu(term(Shape{2 * p + 1, 3}, DType::f32, 0)) : x,
                                {.axis = axis});
                   },
                   {"shapes disagree"});
      expect_error(
          mesh, axis, "another dtype on one device",
          [&] { all_reduce(mesh, last ? on_gpu(term(s, DType::f64, 0)) : x, {.axis = axis}); },
          {"mixed dtypes across the group"});
      expect_error(mesh, axis, "other numerics on one device",
                   [&] {
                     all_reduce(
                         mesh, x,
                         {.axis = axis, .numerics = last ? Numerics::nccl : Numerics::exact});
                   },
                   {"devices disagree on numerics"});
      expect_error(mesh, axis, "a host tensor on one device",
                   [&] {
                     if (last) {
                       all_reduce(mesh, x.to_host(), {.axis = axis});
                     } else {
                       all_reduce(mesh, x, {.axis = axis});
                     }
                   },
                   {"devices disagree on memory", "in host memory"});
    }
    // NCCL was never entered out of step: the group's next collective is right.
    DeviceTensor ones = on_gpu(Tensor::from_vector(Shape{2}, std::vector<float>{1, 1}));
    all_reduce_inplace(mesh, ones, {.axis = axis});
    EXPECT_EQ(ones.to_host().item(0), p) << "the group is out of step";
  });
}

}  // namespace
}  // namespace meshtest::dist
