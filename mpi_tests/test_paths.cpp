// The CCLs' path seam for device memory: an operand in device memory goes to a path registered
// for that memory and only there, host tensors never do; no such path, every path declining,
// memory that differs across the group, an operand's own error and a trace of device memory are
// each an Error on every device; a reduction's numerics (the option, MESHTEST_GPU_REDUCE) reach
// the path as agreed. The "device" memory here is host memory labelled cuda:0, moved by a
// stand-in path that delegates to the registered MPI path. (A host path of a test's own, and the
// choice of a path per call: test_path_plugin.cpp.)
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "dist/ccl/front_end.hpp"
#include "dist/ccl/path_registry.hpp"
#include "mpi_tests/support/ccl_expect_error.hpp"
#include "mpi_tests/support/ccl_paths.hpp"
#include "mpi_tests/support/scoped_env.hpp"
#include "src/core/tensor.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::dist {
namespace {

using ccl_test::expect_error;
using ccl_test::path_input;
using detail::Call;
using detail::Path;
using detail::PathInfo;

/// t's bytes labelled as memory of cuda:0 (never dereferenced as such: the stand-in path moves
/// them on the host).
CclArg on_gpu(const Tensor& t) {
  CclArg a = host_arg(t);
  a.where = Memory::cuda(0);
  a.tensor = nullptr;
  return a;
}

MakeOutput gpu_output(Tensor& out) {
  return [&out](const Shape& shape, DType dtype) {
    out = Tensor(shape, dtype, Tensor::Uninitialized{});
    return on_gpu(out);
  };
}

/// A device path standing in for a GPU one: records each exchange it takes and moves the data as
/// the MPI path does.
class RecordingPath final : public Path {
 public:
  const PathInfo& info() const override {
    static constexpr PathInfo kInfo{.name = "test_device", .memory = Memory::Kind::cuda};
    return kInfo;
  }
  bool all_gather(Call& call, const detail::AllGatherExchange& x) override {
    taken.emplace_back("all_gather");
    return ccl_test::registered_path("mpi").all_gather(call, x);
  }
  bool reduce_scatter(Call& call, const detail::ReduceScatterExchange& x) override {
    taken.emplace_back("reduce_scatter");
    numerics.push_back(x.numerics);
    return ccl_test::registered_path("mpi").reduce_scatter(call, x);
  }
  bool all_reduce(Call& call, const detail::AllReduceExchange& x) override {
    taken.emplace_back("all_reduce");
    numerics.push_back(x.numerics);
    return ccl_test::registered_path("mpi").all_reduce(call, x);
  }
  bool all_to_all(Call& call, const detail::AllToAllExchange& x) override {
    taken.emplace_back("all_to_all");
    return ccl_test::registered_path("mpi").all_to_all(call, x);
  }
  bool broadcast(Call& call, const detail::BroadcastExchange& x) override {
    taken.emplace_back("broadcast");
    return ccl_test::registered_path("mpi").broadcast(call, x);
  }
  std::vector<std::string> taken;
  std::vector<Numerics> numerics;  ///< of each reduction taken
};

/// A device path that declines every exchange.
class DecliningPath final : public Path {
 public:
  const PathInfo& info() const override {
    static constexpr PathInfo kInfo{.name = "test_declining", .memory = Memory::Kind::cuda};
    return kInfo;
  }
};

using DevicePath = detail::ScopedPath;

TEST(CclPaths, DeviceMemoryTakesTheDevicePathWithTheHostResults) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  RecordingPath device;
  const DevicePath installed(device);
  const std::vector<std::int64_t> counts = split_sizes(x.shape()[1], mesh.size());
  Tensor out;

  detail::all_gather(mesh, on_gpu(x), {.dim = 1}, gpu_output(out));
  EXPECT_TRUE(out.bitwise_equal(all_gather(mesh, x, {.dim = 1}))) << "all_gather";
  detail::reduce_scatter(mesh, on_gpu(x), {.dim = 1, .op = ReduceOp::max}, gpu_output(out));
  EXPECT_TRUE(out.bitwise_equal(reduce_scatter(mesh, x, {.dim = 1, .op = ReduceOp::max})))
      << "reduce_scatter";
  out = Tensor(x.shape(), x.dtype());
  detail::all_reduce(mesh, on_gpu(x), on_gpu(out), {.op = ReduceOp::avg}, false);
  EXPECT_TRUE(out.bitwise_equal(all_reduce(mesh, x, {.op = ReduceOp::avg}))) << "all_reduce";
  Tensor in_place = x;
  detail::all_reduce(mesh, on_gpu(in_place), on_gpu(in_place), {}, true);
  EXPECT_TRUE(in_place.bitwise_equal(all_reduce(mesh, x))) << "all_reduce_inplace";
  detail::all_to_all(mesh, on_gpu(x), {.split_dim = 1, .concat_dim = 0}, gpu_output(out));
  EXPECT_TRUE(out.bitwise_equal(all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 0})))
      << "all_to_all";
  detail::all_to_all_v(mesh, on_gpu(x), counts, {.split_dim = 1, .concat_dim = 1}, gpu_output(out));
  EXPECT_TRUE(out.bitwise_equal(all_to_all_v(mesh, x, counts, {.split_dim = 1, .concat_dim = 1})))
      << "all_to_all_v";
  const int root = mesh.size() - 1;
  detail::broadcast(mesh, on_gpu(x), {.root = root}, gpu_output(out));
  EXPECT_TRUE(out.bitwise_equal(broadcast(mesh, x, {.root = root}))) << "broadcast";

  // The host calls above took the host paths: the device path saw only the device operands.
  EXPECT_EQ(device.taken,
            (std::vector<std::string>{"all_gather", "reduce_scatter", "all_reduce", "all_reduce",
                                      "all_to_all", "all_to_all", "broadcast"}));
}

TEST(CclPaths, DeviceMemoryWithoutADevicePathIsAnError) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  Tensor out;  // this binary registers no path for cuda memory
  expect_error(mesh, kAllAxes, "all_gather",
               [&] { detail::all_gather(mesh, on_gpu(x), {.dim = 1}, gpu_output(out)); },
               {"all_gather on axis all",
                "no path moves this call's data (operand in cuda memory; "
                "the paths of that memory: none)"});
  expect_error(mesh, kAllAxes, "broadcast",
               [&] { detail::broadcast(mesh, on_gpu(x), {}, gpu_output(out)); },
               {"broadcast on axis all", "operand in cuda memory; the paths of that memory: none"});
}

TEST(CclPaths, EveryPathDecliningIsAnError) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  DecliningPath declining;
  const DevicePath installed(declining);
  Tensor out = x;
  expect_error(mesh, kAllAxes, "all_reduce",
               [&] { detail::all_reduce(mesh, on_gpu(x), on_gpu(out), {}, false); },
               {"all_reduce on axis all",
                "no path moves this call's data (operand in cuda memory; the "
                "paths of that memory: test_declining)"});
}

TEST(CclPaths, MemoryDifferingAcrossTheGroupIsAnErrorNamingTheDevice) {
  const MeshDevice mesh = MeshDevice::line();
  if (mesh.size() < 2) GTEST_SKIP() << "one device cannot disagree with itself";
  const Tensor x = path_input(mesh);
  RecordingPath device;  // device 0 would take it, were the group agreed
  const DevicePath installed(device);
  const bool gpu = mesh.device_id() == 0;
  const CclArg arg = gpu ? on_gpu(x) : host_arg(x);
  Tensor out;
  const MakeOutput make = gpu ? gpu_output(out) : host_output(out);
  const std::string want =
      "devices disagree on memory: device 0 (axis index 0) passes a tensor in cuda:0 memory but "
      "device 1 (axis index 1) passes one in host memory";
  expect_error(mesh, kAllAxes, "all_gather",
               [&] { detail::all_gather(mesh, arg, {.dim = 1}, make); }, {want});
  out = x;
  const CclArg out_arg = gpu ? on_gpu(out) : host_arg(out);
  expect_error(mesh, kAllAxes, "all_reduce",
               [&] { detail::all_reduce(mesh, arg, out_arg, {}, false); }, {want});
  // broadcast agrees on no shape or dtype, but on the memory all the same.
  expect_error(mesh, kAllAxes, "broadcast", [&] { detail::broadcast(mesh, arg, {}, make); },
               {want});
  EXPECT_TRUE(device.taken.empty());
}

TEST(CclPaths, TracingDeviceMemoryIsAnError) {
  const MeshDevice mesh = MeshDevice::line();
  RecordingPath device;
  const DevicePath installed(device);
  perf::Trace trace;
  Tensor& x = trace.input(path_input(mesh));
  Tensor out(x.shape(), x.dtype());  // zeros; the sum of the inputs is not
  expect_error(
      mesh, kAllAxes, "all_reduce in a capture",
      [&] { trace.capture([&] { detail::all_reduce(mesh, on_gpu(x), on_gpu(out), {}, false); }); },
      {"a perf::Trace captures host tensors only, and this call's operand is in cuda memory"});
  EXPECT_TRUE(out.bitwise_equal(Tensor(x.shape(), x.dtype()))) << "the data moved before the error";
}

TEST(CclPaths, AnOperandsOwnErrorIsReportedOnEveryDevice) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  RecordingPath device;
  const DevicePath installed(device);
  CclArg arg = on_gpu(x);
  if (mesh.device_id() == mesh.size() - 1) arg.error = "x is on the wrong GPU";
  Tensor out;
  expect_error(mesh, kAllAxes, "all_gather",
               [&] { detail::all_gather(mesh, arg, {.dim = 1}, gpu_output(out)); },
               {fmt::format("all_gather on axis all of mesh {}: device {} (axis index {}): x is on "
                            "the wrong GPU",
                            mesh.str(), mesh.size() - 1, mesh.size() - 1)});
  EXPECT_TRUE(device.taken.empty());
}

TEST(CclPaths, NumericsReachTheDevicePathAsAgreed) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  RecordingPath device;
  const DevicePath installed(device);
  Tensor reduced = x, scattered;
  // One all_reduce and one reduce_scatter on device memory with the option n.
  const auto reduce = [&](Numerics n) {
    detail::all_reduce(mesh, on_gpu(x), on_gpu(reduced), {.numerics = n}, false);
    detail::reduce_scatter(mesh, on_gpu(x), {.dim = 1, .numerics = n}, gpu_output(scattered));
  };
  {
    const test_support::ScopedEnv unset("MESHTEST_GPU_REDUCE", std::nullopt);
    reduce(Numerics::from_env);
    reduce(Numerics::nccl);
  }
  {
    const test_support::ScopedEnv env("MESHTEST_GPU_REDUCE", "nccl");
    reduce(Numerics::from_env);
    reduce(Numerics::exact);
  }
  {
    const test_support::ScopedEnv env("MESHTEST_GPU_REDUCE", "exact");
    reduce(Numerics::from_env);
  }
  using enum Numerics;
  EXPECT_EQ(device.numerics, (std::vector<Numerics>{exact, exact, nccl, nccl, nccl, nccl, exact,
                                                    exact, exact, exact}));
}

TEST(CclPaths, BadNumericsAreErrorsOnEveryDevice) {
  const MeshDevice mesh = MeshDevice::line();
  const Tensor x = path_input(mesh);
  RecordingPath device;
  const DevicePath installed(device);
  Tensor out = x;
  {
    const test_support::ScopedEnv env("MESHTEST_GPU_REDUCE", "fast");
    expect_error(mesh, kAllAxes, "a bad MESHTEST_GPU_REDUCE",
                 [&] { detail::all_reduce(mesh, on_gpu(x), on_gpu(out), {}, false); },
                 {"all_reduce on axis all",
                  "MESHTEST_GPU_REDUCE is 'fast'; expected exact (the "
                  "default) or nccl"});
    // Host memory has one numerics: the variable does not concern it.
    EXPECT_TRUE(
        all_reduce(mesh, x).bitwise_equal(all_reduce(mesh, x, {.numerics = Numerics::exact})));
  }
  expect_error(mesh, kAllAxes, "nccl on host memory",
               [&] { reduce_scatter(mesh, x, {.dim = 1, .numerics = Numerics::nccl}); },
               {"reduce_scatter on axis all",
                "numerics nccl (NCCL's own reductions) is for "
                "tensors on a GPU, and x f32["});
  if (mesh.size() > 1) {
    const Numerics mine = mesh.device_id() == 1 ? Numerics::nccl : Numerics::exact;
    expect_error(
        mesh, kAllAxes, "numerics differing across the group",
        [&] { detail::all_reduce(mesh, on_gpu(x), on_gpu(out), {.numerics = mine}, false); },
        {"devices disagree on numerics (the option, or MESHTEST_GPU_REDUCE): device 0 (axis "
         "index 0) passes exact but device 1 (axis index 1) passes nccl"});
  }
  EXPECT_TRUE(device.taken.empty());
}

}  // namespace
}  // namespace meshtest::dist
