// The fp8 matmul's GPU versions sharded over GPU ranks
// (dist/gpu/parallel/fp8_matmul_gpu_parallel.hpp), column-parallel and row-parallel, on each axis
// of every mesh shape of the world (gpu_terms.hpp): against the same version's single-device run
// (the same sums in another order, within the f32 error model of the CPU shard test at the
// version's accumulation roundoff; gpu v2's column-parallel run bit for bit) and against the f64
// reference within the version's tolerance; every block counted exactly once (operands whose blocks
// carry distinct powers of two make exact sums); bad input is one Error on every device. Skips
// every test, with the reason, where a rank has no GPU of its own.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dist/gpu/parallel/fp8_matmul_gpu_parallel.hpp"
#include "dist/kernels/fp8_matmul_parallel.hpp"
#include "dist/mesh/agree.hpp"
#include "dist/testing/gpu/gpu_test.hpp"
#include "mpi_tests/gpu/gpu_terms.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/fp8.hpp"
#include "src/gpu/kernels/fp8_matmul.hpp"
#include "src/gpu/runtime.hpp"
#include "src/kernels/fp8_matmul.hpp"
#include "src/ops/block_quant.hpp"
#include "src/ops/linear.hpp"

namespace meshtest::dist {
namespace {

using gpu::for_each_mesh_axis;
using kernels::Config;
using kernels::Inputs;
using meshtest::gpu::GpuVersion;
using testing::error_message_of;

class GpuFp8Sharded : public ::testing::Test {
 protected:
  void SetUp() override { testing::set_test_timeout(std::chrono::seconds(300)); }
};

const meshtest::gpu::GpuFamily& family() {
  static const meshtest::gpu::GpuFamily f = meshtest::gpu::fp8_matmul_gpu_family();
  return f;
}

// By pointer, not std::string: GCC 13's -Wdangling-reference takes a reference returned from a
// call with a temporary argument for one into that temporary.
const GpuVersion& version(const char* name) {
  const auto it = std::ranges::find(family().versions, name, &GpuVersion::name);
  MESHTEST_CHECK(it != family().versions.end(), "fp8_matmul_gpu has no version {}", name);
  return *it;
}

const Config& named(const std::vector<Config>& configs, const char* name) {
  const auto it = std::ranges::find(configs, name, &Config::name);
  MESHTEST_CHECK(it != configs.end(), "fp8_matmul has no configuration {}", name);
  return *it;
}

/// The family's quick configurations (blocks of 16, 32 and 128, none of which gpu v3 runs), its
/// "small" one and a shape cuBLASLt takes in three blocks each way (gpu v3, on sm_90).
std::vector<Config> configs() {
  std::vector<Config> all = family().quick_configs();
  all.push_back(named(family().cpu->configs, "small"));
  all.push_back(kernels::fp8_matmul_config("lt ragged", 136, 272, 384, 128));
  return all;
}

/// n of the error model of one output (the family's): the k products and two roundings per K
/// block (the scales' product, the scaled partial's addition).
std::int64_t matmul_terms(const Config& c) { return c.k + 2 * ((c.k + c.block - 1) / c.block); }

/// v's accumulation roundoff over f32's (1, 2, 1024): its tolerance over the configuration's.
double roundoff_factor(const GpuVersion& v, const Config& c) {
  return v.tolerance ? v.tolerance(c) / c.tolerance : 1.0;
}

/// v's tolerance against the f64 reference for `extra` more additions per output than the
/// family counts (the all_reduce of row-parallel's p partial products): the configuration's
/// bound grows as the error model's does from n to n + extra terms.
double tolerance(const GpuVersion& v, const Config& c, std::int64_t extra) {
  const auto bound = [](std::int64_t n) {
    return error_bound({.dtype = DType::f32, .terms = n, .reference = Reference::exact}, 1, 1);
  };
  return c.tolerance * roundoff_factor(v, c) * bound(matmul_terms(c) + extra) /
         bound(matmul_terms(c));
}

/// Why v does not run c on some rank ("" when it runs on every rank). Collective over the world,
/// so that every rank skips together.
std::string skip_reason(const GpuVersion& v, const Config& c) {
  const std::string mine = v.unsupported(c);
  if (all_ranks(MPI_COMM_WORLD, mine.empty())) return "";
  return mine.empty() ? std::string("another rank's GPU cannot run it") : mine;
}

bool world_root() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

/// v on the whole of `in` on this rank's GPU, brought back to the host.
Tensor run_whole(const GpuVersion& v, const Inputs& in) {
  const meshtest::gpu::PreparedRun run = v.prepare(in);
  const meshtest::gpu::Stream stream;
  run.launch(stream.get());
  stream.synchronize();
  return run.output();
}

using ShardedRun = DeviceTensor (*)(const MeshDevice&, int, const GpuVersion&, const Inputs&);

struct Layout {
  const char* name;
  ShardedRun run;
  bool sums_partials;  ///< row-parallel: p partial products added by all_reduce
};
constexpr std::array<Layout, 2> kLayouts = {
    Layout{"column-parallel", fp8_matmul_gpu_column_parallel, false},
    Layout{"row-parallel", fp8_matmul_gpu_row_parallel, true}};

/// The largest differences of one version in one layout on one configuration, over every mesh,
/// axis and rank; printed by rank 0, so that a run on GPUs shows what the bounds leave.
struct Worst {
  std::array<double, 3> max{};    // vs single: max rel, model ratio; vs f64: max rel
  std::array<double, 2> count{};  // runs, runs bit for bit the single-device run

  /// Collective over the world.
  void print(const std::string& what, double factor, double tolerance) {
    MPI_Allreduce(MPI_IN_PLACE, max.data(), 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, count.data(), 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (!world_root()) return;
    std::printf(
        "%s: vs single device: max rel %.3g, model ratio %.3g (bound %g), bitwise equal in %g of "
        "%g; vs f64: max rel %.3g (tolerance %.3g at p = 1)\n",
        what.c_str(), max[0], max[1], factor, count[1], count[0], max[2], tolerance);
  }
};

TEST_F(GpuFp8Sharded, EveryVersionInBothLayoutsMatchesItsSingleDeviceRunAndTheReference) {
  for (const Config& c : configs()) {
    const Inputs in = family().cpu->make_inputs(c);
    const Tensor reference = family().cpu->reference(in);
    const kernels::Fp8MatmulOperands o = kernels::fp8_matmul_operands(in);
    // Σ |x_k w_k| per output, of the dequantized operands: the error model's magnitude.
    const Tensor scale = linear(magnitude(dequantize(o.x)), magnitude(dequantize(o.w)));
    for (const GpuVersion& v : family().versions) {
      const std::string skipped = skip_reason(v, c);
      if (!skipped.empty()) {
        if (world_root())
          std::printf("%s on %s: skipped: %s\n", v.name.c_str(), c.name.c_str(), skipped.c_str());
        continue;
      }
      const Tensor single = run_whole(v, in);
      const double factor = roundoff_factor(v, c);
      for (const Layout& layout : kLayouts) {
        Worst worst;
        for_each_mesh_axis([&](const MeshDevice& mesh, int axis) {
          const int p = mesh.axis_size(axis);
          const std::string what =
              fmt::format("{} {} on '{}' (m {} n {} k {} block {}) over {}", v.name, layout.name,
                          c.name, c.m, c.n, c.k, c.block, p);
          const Tensor got = layout.run(mesh, axis, v, in).to_host();
          // (a) The single-device run's sums in another order: the CPU shard test's f32 model
          // (the row-parallel all_reduce adds p terms), its roundoff scaled to the version's
          // accumulation. Column-parallel keeps each output's order where the kernel's order
          // depends on k alone (gpu v2: bit for bit); cuBLAS and cuBLASLt may block another
          // shape differently (gpu v1, v3).
          const ErrorModel model{.dtype = DType::f32,
                                 .terms = matmul_terms(c) + (layout.sums_partials ? p : 0),
                                 .reference = Reference::other_order};
          const Comparison vs_single = compare(single, got, model, scale);
          EXPECT_TRUE(vs_single.nan_or_inf_count == 0 && vs_single.value <= factor)
              << what << ": against the single-device run, " << vs_single.value
              << " x the f32 model's bound (" << model.str() << "), more than " << factor
              << "; worst element " << vs_single.worst_index << ": single "
              << vs_single.expected_at_worst << ", sharded " << vs_single.got_at_worst;
          const bool equal = got.bitwise_equal(single);
          if (v.name == "gpu v2" && !layout.sums_partials) {
            EXPECT_TRUE(equal) << what
                               << ": gpu v2 orders each output's sum by k alone, so its "
                                  "columns on one device are those of the whole run";
          }
          // (b) The f64 reference, within the version's tolerance (widened for the p partials).
          const double tol = tolerance(v, c, layout.sums_partials ? p : 0);
          const kernels::Check check = kernels::measure(reference, got, tol);
          EXPECT_TRUE(check.pass) << what << ": against f64, max rel " << check.max_rel
                                  << " > tolerance " << tol << ", PCC " << check.pcc;
          const kernels::Check diff = kernels::measure(single, got, 0);
          worst.max = {std::max(worst.max[0], diff.max_rel),
                       std::max(worst.max[1], vs_single.value),
                       std::max(worst.max[2], check.max_rel)};
          worst.count[0] += 1;
          worst.count[1] += equal ? 1 : 0;
        });
        worst.print(fmt::format("{} {} on {}", v.name, layout.name, c.name), factor,
                    tolerance(v, c, 0));
      }
    }
  }
}

/// Operands whose codes are all 1.0, x's scales 1 and w's block (j, kb) scale (j + 1) 2^kb:
/// y[r][col] = (col / b + 1) Σ_kb width_kb 2^kb, a small integer that every version computes
/// exactly in any order, so a block left out or added twice shows in the bits.
Inputs tagged_inputs(const Config& c) {
  const std::int64_t nb = (c.n + c.block - 1) / c.block, nk = (c.k + c.block - 1) / c.block;
  const std::uint8_t one = fp8_encode(1.0f, Fp8Format::e4m3fn);
  Tensor xq(Shape({c.m, c.k}), DType::u8), wq(Shape({c.n, c.k}), DType::u8);
  std::ranges::fill(xq.span<std::uint8_t>(), one);
  std::ranges::fill(wq.span<std::uint8_t>(), one);
  Tensor xs(Shape({c.m, nk}), DType::f32), ws(Shape({nb, nk}), DType::f32);
  xs.fill(1.0);
  for (std::int64_t j = 0; j < nb; ++j) {
    for (std::int64_t kb = 0; kb < nk; ++kb)
      ws.data<float>()[j * nk + kb] = static_cast<float>((j + 1) << kb);
  }
  return {.config = c, .tensors = {xq, xs, wq, ws}};
}

Tensor tagged_output(const Config& c) {
  std::int64_t per_block_row = 0;  // Σ_kb width_kb 2^kb
  for (std::int64_t k0 = 0, kb = 0; k0 < c.k; k0 += c.block, ++kb)
    per_block_row += std::min(c.block, c.k - k0) << kb;
  Tensor y(Shape({c.m, c.n}), DType::f32);
  for (std::int64_t r = 0; r < c.m; ++r) {
    for (std::int64_t col = 0; col < c.n; ++col)
      y.data<float>()[r * c.n + col] = static_cast<float>((col / c.block + 1) * per_block_row);
  }
  return y;
}

TEST_F(GpuFp8Sharded, EveryBlockIsAddedOnce) {
  for (const Config& c : {kernels::fp8_matmul_config("tagged ragged", 5, 40, 70, 16),
                          kernels::fp8_matmul_config("tagged lt", 8, 272, 384, 128)}) {
    const Inputs in = tagged_inputs(c);
    const Tensor want = tagged_output(c);
    for (const GpuVersion& v : family().versions) {
      if (!skip_reason(v, c).empty()) continue;  // the test above says why
      for_each_mesh_axis([&](const MeshDevice& mesh, int axis) {
        for (const Layout& layout : kLayouts) {
          gpu::expect_bits(want, layout.run(mesh, axis, v, in).to_host(),
                           fmt::format("{} {} on {} over {}", v.name, layout.name, c.name,
                                       mesh.axis_size(axis)));
        }
      });
    }
  }
}

TEST_F(GpuFp8Sharded, BadInputIsOneErrorOnEveryDevice) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const MeshDevice& mesh = gpu::mesh_of(1, world);
  const int p = mesh.axis_size(kAllAxes);
  const GpuVersion& v1 = version("gpu v1");
  const Inputs tiny =
      family().cpu->make_inputs(named(family().quick_configs(), "tiny"));  // 16 x 32 x 48, b = 16
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(layout.name);
    // An axis a mesh does not have: MeshDevice's Error, on every device before anything runs.
    EXPECT_EQ(error_message_of([&] { (void)layout.run(mesh, 2, v1, tiny); }),
              "mesh axis 2 out of range: a mesh has axes 0 and 1 (or kAllAxes = -1)");
    // gpu v3 takes blocks of 128 only: every device rejects its shard, the first is named.
    const Config first = (layout.sums_partials ? fp8_matmul_row_shard(tiny, p, 0)
                                               : fp8_matmul_column_shard(tiny, p, 0))
                             .config;
    EXPECT_EQ(error_message_of([&] { (void)layout.run(mesh, kAllAxes, version("gpu v3"), tiny); }),
              fmt::format("device 0 of {} rejected its input: fp8_matmul_gpu_{}: gpu v3 cannot run "
                          "this device's shard of 'tiny' (m 16 n {} k {} block 16): block 16: "
                          "cuBLASLt's fp8 block scaling takes b = 128",
                          p, layout.sums_partials ? "row_parallel" : "column_parallel", first.n,
                          first.k));
    Inputs three = tiny;
    three.tensors.pop_back();
    MESHTEST_EXPECT_ERROR(layout.run(mesh, kAllAxes, v1, three),
                          "fp8_matmul: 4 operands (xq, xs, wq, ws) expected, got 3");
  }
  // A version that cannot run one device's shard only (fewer than 16 rows of w): every device
  // throws that device's Error, and none is left waiting in the all_gather.
  GpuVersion picky = v1;
  picky.name = "picky v1";
  picky.unsupported = [](const Config& c) {
    return c.n < 16 ? fmt::format("n {} < 16 (this test's rule)", c.n) : std::string();
  };
  const Inputs ragged =
      family().cpu->make_inputs(named(family().quick_configs(), "ragged"));  // n 40, b = 16
  std::string want;
  for (int i = 0; i < p && want.empty(); ++i) {
    const std::int64_t n = fp8_matmul_column_shard(ragged, p, i).config.n;
    if (n > 0 && n < 16) {
      want = fmt::format(
          "device {} of {} rejected its input: fp8_matmul_gpu_column_parallel: picky v1 cannot "
          "run this device's shard of 'ragged' (m 33 n {} k 70 block 16): n {} < 16 (this "
          "test's rule)",
          i, p, n, n);
    }
  }
  EXPECT_EQ(error_message_of(
                [&] { (void)fp8_matmul_gpu_column_parallel(mesh, kAllAxes, picky, ragged); }),
            want);
  // The axis still works after the refusals (gpu v2's columns are bit for bit the whole run's).
  const GpuVersion& v2 = version("gpu v2");
  gpu::expect_bits(run_whole(v2, tiny),
                   fp8_matmul_gpu_column_parallel(mesh, kAllAxes, v2, tiny).to_host(),
                   "gpu v2 column-parallel on tiny after the errors");
}

}  // namespace
}  // namespace meshtest::dist
