// The qkv_rope case of the fused-op kit (mpi_tests/support/fused_qkv_rope.hpp: the module's
// linear + split_qkv + rope as the reference, the TP placements, the error model) with
// gpu::qkv_rope on each rank's GPU as the fused op (dist/testing/gpu_fused.hpp): check,
// device_perf and single_device over the kit's grid, the program cache off and on, and trace =
// a CUDA graph of the Linear, the split and the rotation (the rope table kept on the GPU),
// replayed bit-equal to the eager call.
#include "dist/testing/gpu/gpu_test.hpp"
#include "dist/testing/gpu_fused.hpp"
#include "mpi_tests/support/fused_qkv_rope.hpp"
#include "src/gpu/blas.hpp"
#include "src/gpu/qkv_rope.hpp"

namespace meshtest::dist::fused_test {
namespace {

/// This device's heads on its GPU (on the capture's stream while the kit captures the graph),
/// complete when it returns.
std::vector<DeviceTensor> qkv_rope_on_gpu(const FusedSetup& s, const MeshDevice&,
                                          const std::vector<DeviceTensor>& local) {
  // One per rank, never destroyed: its plans and workspace outlive the kit's graphs.
  static auto& blas = *new meshtest::gpu::Blas;
  const GptOssConfig c = config(s);
  const auto [heads, kv_heads] = qkv_heads(c, local[1].shape()[0]);
  meshtest::gpu::DeviceQkv qkv = meshtest::gpu::qkv_rope(blas, local[0], local[1], local[2],
                                                         {.num_heads = heads,
                                                          .num_kv_heads = kv_heads,
                                                          .rope = c.rope_params(),
                                                          .position_offset = first_position(s)});
  std::vector<DeviceTensor> out;
  out.push_back(std::move(qkv.q));
  out.push_back(std::move(qkv.k));
  out.push_back(std::move(qkv.v));
  return out;
}

}  // namespace

MESHTEST_FUSED_OP_TESTS(gpu_qkv_rope,
                        qkv_rope_case("gpu_qkv_rope", testing::on_gpu_fused(qkv_rope_on_gpu)));

}  // namespace meshtest::dist::fused_test
