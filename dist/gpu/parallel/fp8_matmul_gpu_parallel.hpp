// The fp8 block-quantized matmul's GPU versions (src/gpu/kernels/fp8_matmul.hpp) sharded over a
// mesh axis of GPU ranks, in the two layouts of the CPU family
// (dist/kernels/fp8_matmul_parallel.hpp, whose shard functions cut the inputs here as well):
//   column-parallel: w's N blocks (b rows of wq, one row of ws each) split over the axis by the
//                    array_split rule on the ceil(n / b) blocks, x whole on every device; each
//                    device's output [m, n_i] is all_gathered along N (dist/gpu/ccl/ccl.hpp).
//   row-parallel:    the K blocks (b columns of xq and wq, one column of xs and ws each) split
//                    the same way; the partial products [m, n] are summed by all_reduce, with
//                    the collective's numerics (exact by default, MESHTEST_GPU_REDUCE).
// Each device cuts its shard on the host, prepares the version on it (its operands uploaded to
// the rank's GPU), runs it once on a stream of its own and hands the output to the collective
// where the run wrote it (PreparedRun::device_output): no trip through the host. A shard with
// nothing to compute (no blocks: more devices than blocks; or m = 0) runs nothing and
// contributes an empty piece [m, 0] or a zero partial product, as on CPU ranks.
//
// Collective over the devices of `axis`: every device calls with the same version and the same
// whole inputs (host tensors {xq, xs, wq, ws}, src/kernels/fp8_matmul.hpp), its rank bound to its
// GPU (dist::gpu::bind_rank_to_gpu). Errors: an axis other than 0, 1 or kAllAxes throws at once
// on every device (MeshDevice's Error); a shard the version cannot run on some device (its
// GpuVersion::unsupported reason, or an Error from preparing or running it) makes every device
// of the axis throw the same Error naming the first such device, the version, the shard and
// why, before any collective: nobody is left waiting.
#pragma once

#include "dist/gpu/ccl/ccl.hpp"
#include "dist/mesh/mesh_device.hpp"
#include "src/gpu/kernels/family.hpp"
#include "src/kernels/family.hpp"

namespace meshtest::dist {

/// Column-parallel run of v (see the file comment): y f32 [m, n] on every device of the axis.
DeviceTensor fp8_matmul_gpu_column_parallel(const MeshDevice& mesh, int axis,
                                            const meshtest::gpu::GpuVersion& v,
                                            const kernels::Inputs& in);

/// Row-parallel run of v (see the file comment): y f32 [m, n] on every device of the axis.
DeviceTensor fp8_matmul_gpu_row_parallel(const MeshDevice& mesh, int axis,
                                         const meshtest::gpu::GpuVersion& v,
                                         const kernels::Inputs& in);

}  // namespace meshtest::dist
