// rope (GPU): the host's rope_table kept on each GPU, checks, and one rotation kernel per tensor.
#include "src/gpu/rope.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "src/gpu/capture.hpp"
#include "src/gpu/elementwise_kernel.hpp"
#include "src/gpu/embedding.hpp"
#include "src/gpu/op_timer.hpp"
#include "src/gpu/runtime.hpp"
#include "src/gpu/tensor_checks.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest::gpu {
namespace {

/// The table's identity: its device, dtype and RoPE parameters.
struct TableKey {
  int device = 0;
  DType dtype = DType::f32;
  std::int64_t head_dim = 0, initial_context_length = 0;
  double theta = 0, scaling_factor = 0, ntk_alpha = 0, ntk_beta = 0;
  auto operator<=>(const TableKey&) const = default;
};

/// The host's table of positions [0, rows) on a device.
struct Table {
  std::int64_t rows = 0;
  DeviceTensor cos, sin;
};

/// The kept tables and those outgrown (a captured graph may still read them), never destroyed:
/// their storage must not be freed after the CUDA runtime or DeviceTensor's cache at exit.
struct Tables {
  std::mutex mutex;
  std::map<TableKey, Table> current;  // guarded by mutex
  std::vector<Table> outgrown;        // guarded by mutex
};
Tables& tables() {
  static auto* t = new Tables;
  return *t;
}

/// The kept table of p for dtype on the current device, of at least `need` rows (all.mutex held).
/// A table that is too short is replaced by one of the next power of two of rows (at least
/// 4096): rope_table on the host, then an upload, which a CUDA-graph capture cannot record (an
/// Error then: run the op once eagerly at those positions first). Row p of a longer table is the
/// shorter one's: each row depends on its position only.
Table& table_of(Tables& all, const RopeParams& p, DType dtype, std::int64_t need) {
  const TableKey key{.device = current_device(),
                     .dtype = dtype,
                     .head_dim = p.head_dim,
                     .initial_context_length = p.initial_context_length,
                     .theta = p.theta,
                     .scaling_factor = p.scaling_factor,
                     .ntk_alpha = p.ntk_alpha,
                     .ntk_beta = p.ntk_beta};
  Table& t = all.current[key];
  if (t.rows < need) {
    MESHTEST_CHECK(capturing_stream() == nullptr,
                   "gpu rope: positions up to {} are not in the table on the GPU yet, and a CUDA "
                   "graph capture cannot upload it: run the op once eagerly at these positions "
                   "before capturing",
                   need);
    std::int64_t rows = 4096;
    while (rows < need) rows *= 2;
    const RopeTable host = rope_table(p, rows, 0, dtype);
    if (t.rows > 0) all.outgrown.push_back(std::move(t));
    t = Table{.rows = rows,
              .cos = DeviceTensor::from_host(host.cos),
              .sin = DeviceTensor::from_host(host.sin)};
  }
  return t;
}

/// Rows [offset, offset + tokens) of p's cos and sin tables on the current device: pointers into
/// a kept table of at least offset + tokens rows (table_of).
std::pair<const std::byte*, const std::byte*> table_rows(const RopeParams& p, DType dtype,
                                                         std::int64_t offset, std::int64_t tokens) {
  Tables& all = tables();
  const std::lock_guard lock(all.mutex);
  Table& t = table_of(all, p, dtype, offset + tokens);
  const std::int64_t row_bytes = p.head_dim / 2 * static_cast<std::int64_t>(dtype_size(dtype));
  return {t.cos.bytes() + offset * row_bytes, t.sin.bytes() + offset * row_bytes};
}

/// x rotated by the table rows at cos and sin ([T, d/2] each, x's dtype, on x's device), queued
/// on `stream` under an "apply_rope" record. x: [T, ..., 2 half], checked by the caller.
DeviceTensor rotated(const DeviceTensor& x, const std::byte* cos, const std::byte* sin,
                     std::int64_t half, cudaStream_t stream) {
  const std::int64_t tokens = x.shape()[0];
  DeviceTensor y(x.shape(), x.dtype(), Tensor::Uninitialized{});
  perf::OpScope scope("apply_rope");
  scope.input(info(x));
  time_on_stream(scope, stream);  // last before the launch (see linear)
  const std::int64_t heads = tokens == 0 ? 0 : x.numel() / (tokens * 2 * half);
  MESHTEST_CUDA_CHECK(
      detail::launch_apply_rope(x.dtype() == DType::bf16 ? detail::Float::bf16 : detail::Float::f32,
                                x.bytes(), cos, sin, y.bytes(), tokens, heads, half, stream));
  scope.output(info(y)).flops(3.0 * static_cast<double>(x.numel()));
  return y;
}

/// The checks of a (q, k) pair (rope's and rope_at's).
void check_pair(std::string_view op, const DeviceTensor& q, const DeviceTensor& k) {
  MESHTEST_CHECK(q.rank() >= 1 && k.rank() >= 1 && q.shape()[0] == k.shape()[0],
                 "{}: q {} and k {} must have the same number of tokens (dim 0)", op, describe(q),
                 describe(k));
  MESHTEST_CHECK(q.dtype() == k.dtype(), "{}: q is {} but k is {}", op, describe(q), describe(k));
}

void check_rotated(std::string_view op, const DeviceTensor& x, std::int64_t tokens,
                   std::int64_t half) {
  MESHTEST_CHECK(x.rank() >= 2 && x.shape()[0] == tokens && x.shape()[x.rank() - 1] == 2 * half,
                 "{}: x is {}, expected [T = {}, ..., head_dim = {}]", op, describe(x), tokens,
                 2 * half);
  MESHTEST_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16,
                 "{}: x is {}: f32 or bf16 expected", op, describe(x));
}

}  // namespace

DeviceTensor apply_rope(const DeviceTensor& x, const DeviceTensor& cos, const DeviceTensor& sin,
                        cudaStream_t stream) {
  constexpr std::string_view op = "gpu apply_rope";
  MESHTEST_CHECK(cos.rank() == 2 && sin.shape() == cos.shape(),
                 "{}: the table is cos {} and sin {}, expected two [T, d/2]", op, describe(cos),
                 describe(sin));
  const std::int64_t tokens = cos.shape()[0], half = cos.shape()[1];
  check_rotated(op, x, tokens, half);
  check_dtype(op, "cos", cos, x.dtype());
  check_dtype(op, "sin", sin, x.dtype());
  const int device = x.empty() ? current_device() : x.device();
  check_on_device(op, "cos", cos, device);
  check_on_device(op, "sin", sin, device);
  const DeviceGuard guard(device);
  return rotated(x, cos.bytes(), sin.bytes(), half, stream);
}

std::pair<DeviceTensor, DeviceTensor> rope(const DeviceTensor& q, const DeviceTensor& k,
                                           const RopeParams& p, cudaStream_t stream,
                                           std::int64_t position_offset) {
  constexpr std::string_view op = "gpu rope";
  check_pair(op, q, k);
  MESHTEST_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && position_offset >= 0,
                 "{}: head_dim {} must be even and > 0, position_offset {} >= 0", op, p.head_dim,
                 position_offset);
  const std::int64_t tokens = q.shape()[0], half = p.head_dim / 2;
  check_rotated(op, q, tokens, half);
  check_rotated(op, k, tokens, half);
  const DeviceGuard guard(q.empty() ? current_device() : q.device());
  perf::OpScope scope("rope");
  scope.input(info(q)).input(info(k)).attr("offset", position_offset);
  const auto [cos, sin] = table_rows(p, q.dtype(), position_offset, tokens);
  std::pair<DeviceTensor, DeviceTensor> out{rotated(q, cos, sin, half, stream),
                                            rotated(k, cos, sin, half, stream)};
  scope.output(info(out.first)).output(info(out.second));
  return out;
}

std::pair<DeviceTensor, DeviceTensor> rope_at(const DeviceTensor& q, const DeviceTensor& k,
                                              const RopeParams& p, cudaStream_t stream,
                                              std::span<const std::int64_t> positions) {
  constexpr std::string_view op = "gpu rope_at";
  check_pair(op, q, k);
  MESHTEST_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0, "{}: head_dim {} must be even and > 0", op,
                 p.head_dim);
  const std::int64_t tokens = q.shape()[0], half = p.head_dim / 2;
  MESHTEST_CHECK(static_cast<std::int64_t>(positions.size()) == tokens,
                 "{}: {} positions for {} tokens", op, positions.size(), tokens);
  std::int64_t need = 0;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    MESHTEST_CHECK(positions[i] >= 0, "{}: position {} (token {}) is negative", op, positions[i],
                   i);
    need = std::max(need, positions[i] + 1);
  }
  check_rotated(op, q, tokens, half);
  check_rotated(op, k, tokens, half);
  const DeviceGuard guard(q.empty() ? current_device() : q.device());
  perf::OpScope scope("rope");
  scope.input(info(q)).input(info(k)).attr("positions", tokens);
  DeviceTensor cos, sin;
  {
    Tables& all = tables();
    const std::lock_guard lock(all.mutex);
    const Table& t = table_of(all, p, q.dtype(), need);
    cos = embedding_shard(positions, t.cos, 0, t.rows, stream);
    sin = embedding_shard(positions, t.sin, 0, t.rows, stream);
  }
  std::pair<DeviceTensor, DeviceTensor> out{rotated(q, cos.bytes(), sin.bytes(), half, stream),
                                            rotated(k, cos.bytes(), sin.bytes(), half, stream)};
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(stream));  // before the gathered rows are freed
  scope.output(info(out.first)).output(info(out.second));
  return out;
}

}  // namespace meshtest::gpu
