// Column- and row-parallel fp8 matmul on GPU ranks: the CPU family's shards, a GPU version run on
// each, the GPU collectives to join the outputs.
#include "dist/gpu/parallel/fp8_matmul_gpu_parallel.hpp"

#include <functional>
#include <string>
#include <string_view>

#include "dist/gpu/ccl/rank_gpu.hpp"
#include "dist/kernels/fp8_matmul_parallel.hpp"
#include "dist/kernels/parallel.hpp"
#include "dist/mesh/agree.hpp"
#include "src/core/error.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist {
namespace {

using meshtest::gpu::GpuVersion;
using meshtest::gpu::PreparedRun;

/// Joins this device's output (f32 on its GPU) with those of the other devices of the axis.
using JoinFn = std::function<DeviceTensor(const DeviceTensor&)>;

/// Runs v on this device's part of `in` (cut by `shard`) and returns `join` of its output. The
/// local work (cutting, checking, preparing, running) is agreed over the axis before `join`, so
/// an Error on one device is the same Error on all of them (`what` names the call in it).
DeviceTensor run_sharded(const MeshDevice& mesh, int axis, const GpuVersion& v,
                         const kernels::Inputs& in, ShardFn shard, std::string_view what,
                         const JoinFn& join) {
  const int parts = mesh.axis_size(axis), index = mesh.axis_index(axis);  // bad axis: Error
  PreparedRun run;
  DeviceTensor nothing;  // the contribution of a shard with nothing to compute
  check_and_agree(mesh.comm(axis), what, [&] {
    MESHTEST_CHECK(gpu::bound_gpu() >= 0,
                   "this rank is not bound to a GPU: call dist::gpu::bind_rank_to_gpu() first");
    const meshtest::gpu::DeviceGuard on_rank_gpu(gpu::bound_gpu());
    const kernels::Inputs local = shard(in, parts, index);
    const kernels::Config& c = local.config;
    if (c.m == 0 || c.n == 0 || c.k == 0) {
      nothing = DeviceTensor(Shape({c.m, c.n}), DType::f32);  // zero-filled: [m, 0] or zeros
      return;
    }
    const std::string why = v.unsupported ? v.unsupported(c) : std::string();
    MESHTEST_CHECK(why.empty(),
                   "{} cannot run this device's shard of '{}' (m {} n {} k {} block {}): {}",
                   v.name, c.name, c.m, c.n, c.k, c.block, why);
    run = v.prepare(local);
    MESHTEST_CHECK(run.launch && run.device_output,
                   "{}: its PreparedRun has no launch or no device_output", v.name);
    const meshtest::gpu::Stream stream;
    run.launch(stream.get());
    stream.synchronize();  // a collective takes complete tensors only
  });
  return join(run.device_output ? run.device_output() : nothing);
}

}  // namespace

DeviceTensor fp8_matmul_gpu_column_parallel(const MeshDevice& mesh, int axis, const GpuVersion& v,
                                            const kernels::Inputs& in) {
  return run_sharded(
      mesh, axis, v, in, fp8_matmul_column_shard, "fp8_matmul_gpu_column_parallel",
      [&](const DeviceTensor& y) { return all_gather(mesh, y, {.dim = 1, .axis = axis}); });
}

DeviceTensor fp8_matmul_gpu_row_parallel(const MeshDevice& mesh, int axis, const GpuVersion& v,
                                         const kernels::Inputs& in) {
  return run_sharded(mesh, axis, v, in, fp8_matmul_row_shard, "fp8_matmul_gpu_row_parallel",
                     [&](const DeviceTensor& y) {
                       return all_reduce(mesh, y, {.axis = axis, .op = ReduceOp::sum});
                     });
}

}  // namespace meshtest::dist
