// ccl (GPU): DeviceTensors as the front ends' operands (CclArg in the rank's GPU memory), their
// outputs allocated on that GPU, over the installed device path.
#include "dist/gpu/ccl/ccl.hpp"

#include <fmt/format.h>

#include <optional>

#include "dist/ccl/front_end.hpp"
#include "dist/gpu/ccl/device_path.hpp"
#include "dist/gpu/ccl/rank_gpu.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist {
namespace {

/// For the scope of one collective: the device path installed and, on a bound rank, its GPU
/// made current.
class OnRankGpu {
 public:
  OnRankGpu() {
    gpu::install_device_path();
    if (gpu::bound_gpu() >= 0) guard_.emplace(gpu::bound_gpu());
  }

 private:
  std::optional<meshtest::gpu::DeviceGuard> guard_;
};

/// x as a front end's operand in the memory of the rank's GPU, carrying the problem that keeps
/// it from taking part (the front end reports it on every device of the group).
CclArg device_arg(const DeviceTensor& x) {
  const int gpu = gpu::bound_gpu();
  CclArg a{.data = const_cast<std::byte*>(x.bytes()),  // an input is only read (see CclArg)
           .shape = x.shape(),
           .dtype = x.dtype(),
           .where = Memory::cuda(gpu)};
  if (gpu < 0) {
    a.error =
        "this rank is not bound to a GPU: call dist::gpu::bind_rank_to_gpu() on every rank "
        "(collective over MPI_COMM_WORLD) before the first collective on device tensors, and make "
        "the tensors on the GPU it binds";
  } else if (!x.empty() && x.device() != gpu) {
    a.error = fmt::format(
        "x {} is not on this rank's GPU, cuda:{} (bind_rank_to_gpu); a collective takes tensors "
        "on the rank's own GPU",
        describe(x), gpu);
  }
  return a;
}

/// A MakeOutput that allocates `out` on the current device (the rank's GPU).
MakeOutput device_output(DeviceTensor& out) {
  return [&out](const Shape& shape, DType dtype) {
    out = DeviceTensor(shape, dtype, Tensor::Uninitialized{});
    return device_arg(out);
  };
}

/// Runs front end `run(x's operand, output maker)` with the rank's GPU current; its output.
template <class Run>
DeviceTensor collective(const DeviceTensor& x, const Run& run) {
  const OnRankGpu on_gpu;
  DeviceTensor out;
  run(device_arg(x), device_output(out));
  return out;
}

}  // namespace

DeviceTensor all_gather(const MeshDevice& mesh, const DeviceTensor& x,
                        const AllGatherOptions& opt) {
  return collective(
      x, [&](const CclArg& in, const MakeOutput& out) { detail::all_gather(mesh, in, opt, out); });
}

DeviceTensor reduce_scatter(const MeshDevice& mesh, const DeviceTensor& x,
                            const ReduceScatterOptions& opt) {
  return collective(x, [&](const CclArg& in, const MakeOutput& out) {
    detail::reduce_scatter(mesh, in, opt, out);
  });
}

DeviceTensor all_reduce(const MeshDevice& mesh, const DeviceTensor& x,
                        const AllReduceOptions& opt) {
  const OnRankGpu on_gpu;
  const CclArg in = device_arg(x);
  // The output is made before the call agrees; a device whose x is refused allocates nothing
  // (its x stands in as the output: the call fails in its agreement on every device).
  DeviceTensor out;
  if (in.error.empty()) out = DeviceTensor(x.shape(), x.dtype(), Tensor::Uninitialized{});
  detail::all_reduce(mesh, in, in.error.empty() ? device_arg(out) : in, opt, false);
  return out;
}

void all_reduce_inplace(const MeshDevice& mesh, DeviceTensor& x, const AllReduceOptions& opt) {
  const OnRankGpu on_gpu;
  const CclArg arg = device_arg(x);
  detail::all_reduce(mesh, arg, arg, opt, true);
}

DeviceTensor all_to_all(const MeshDevice& mesh, const DeviceTensor& x, const AllToAllOptions& opt) {
  return collective(
      x, [&](const CclArg& in, const MakeOutput& out) { detail::all_to_all(mesh, in, opt, out); });
}

DeviceTensor all_to_all_v(const MeshDevice& mesh, const DeviceTensor& x,
                          std::span<const std::int64_t> send_counts, const AllToAllOptions& opt) {
  return collective(x, [&](const CclArg& in, const MakeOutput& out) {
    detail::all_to_all_v(mesh, in, send_counts, opt, out);
  });
}

DeviceTensor broadcast(const MeshDevice& mesh, const DeviceTensor& x, const BroadcastOptions& opt) {
  return collective(
      x, [&](const CclArg& in, const MakeOutput& out) { detail::broadcast(mesh, in, opt, out); });
}

}  // namespace meshtest::dist
