// device_path: the exchanges of the CCLs on GPU memory over the call's NCCL group, with blocks
// packed on the GPU.
#include "dist/gpu/ccl/device_path.hpp"

#include "dist/ccl/detail.hpp"
#include "dist/ccl/path_registry.hpp"
#include "dist/gpu/ccl/exchange.hpp"
#include "dist/gpu/ccl/nccl_comm.hpp"
#include "dist/mesh/mpi_check.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::dist::gpu {
namespace {

using detail::AllGatherExchange;
using detail::AllReduceExchange;
using detail::AllToAllExchange;
using detail::BlockLayout;
using detail::BroadcastExchange;
using detail::Call;
using detail::ReduceScatterExchange;

// The group's workspaces this path uses (slot 0 is the exchanges' own staging).
constexpr int kPacked = 1;    // the input's blocks end to end
constexpr int kReceived = 2;  // the output's blocks end to end, before they are unpacked

Numerics numerics_of(dist::Numerics n) {
  return n == dist::Numerics::nccl ? Numerics::nccl : Numerics::exact;
}

std::size_t bytes_of(const Shape& s, DType t) {
  return static_cast<std::size_t>(s.numel()) * dtype_size(t);
}

/// Queues on `stream` the copies of the blocks of `l` between a tensor ([outer, n, inner] around
/// the layout's dim) and the same blocks laid end to end ([outer, sizes[j], inner] each):
/// tensor -> packed (kToPacked) or back. One 2-D copy per block.
template <bool kToPacked>
void move_blocks(const BlockLayout& l, std::byte* packed, std::byte* tensor, cudaStream_t stream) {
  const std::size_t inner = l.view.inner_bytes;
  std::size_t row = 0;  // bytes of one outer row of the tensor
  for (std::int64_t n : l.sizes) row += static_cast<std::size_t>(n) * inner;
  std::size_t start = 0;  // block j's byte offset within a row
  for (std::int64_t n : l.sizes) {
    const std::size_t run = static_cast<std::size_t>(n) * inner;
    if constexpr (kToPacked) {
      meshtest::gpu::copy_rows(packed, run, tensor + start, row, run, l.view.outer, stream);
    } else {
      meshtest::gpu::copy_rows(tensor + start, row, packed, run, run, l.view.outer, stream);
    }
    packed += run * static_cast<std::size_t>(l.view.outer);
    start += run;
  }
}

/// The tensor's blocks end to end: the tensor itself when the layout is direct, else packed
/// into workspace slot kPacked of g (`bytes`: the tensor's).
const std::byte* packed_input(NcclGroup& g, const BlockLayout& l, const std::byte* tensor,
                              std::size_t bytes) {
  if (l.direct()) return tensor;
  std::byte* packed = g.workspace(bytes, kPacked);
  // move_blocks only reads the tensor when packing.
  move_blocks<true>(l, packed, const_cast<std::byte*>(tensor), g.stream());
  return packed;
}

/// The call's NCCL group: the devices of its axis, NCCL rank = axis index.
NcclGroup& group_of(const Call& call) {
  NcclGroup& g = MeshNccl::of(call.mesh()).group(call.axis());
  MESHTEST_DIST_CHECK(g.size() == call.size() && g.index() == call.index(),
                      "{}: the NCCL group of axis {} has {} devices, this one at {}, but the "
                      "axis group has {}, this one at {}",
                      call.op(), call.axis(), g.size(), g.index(), call.size(), call.index());
  return g;
}

/// Runs `queue`, which queues the call's exchange on g's stream, as the call's data exchange,
/// and waits for the stream.
template <class Queue>
void run(Call& call, NcclGroup& g, const Queue& queue) {
  call.run([&] {
    queue();
    g.synchronize(call.op());
  });
}

class DevicePath final : public detail::Path {
 public:
  const detail::PathInfo& info() const override {
    static constexpr detail::PathInfo kInfo{
        .name = "nccl", .memory = Memory::Kind::cuda, .reach = detail::Reach::any, .priority = 100};
    return kInfo;
  }

  bool all_gather(Call& call, const AllGatherExchange& x) override {
    NcclGroup& g = group_of(call);
    const detail::BlockPlan& pl = *x.plan;
    run(call, g, [&] {
      if (pl.layout.direct()) return gpu::all_gather(g, x.in, pl.elems, x.out, x.t);
      std::byte* received = g.workspace(bytes_of(pl.out_shape, x.t), kReceived);
      gpu::all_gather(g, x.in, pl.elems, received, x.t);
      move_blocks<false>(pl.layout, received, x.out, g.stream());
    });
    return true;
  }

  bool reduce_scatter(Call& call, const ReduceScatterExchange& x) override {
    NcclGroup& g = group_of(call);
    const detail::BlockPlan& pl = *x.plan;
    run(call, g, [&] {
      // Block j of the packed input is [outer, n_j, inner]: device j's output as it is laid out.
      const std::byte* in = packed_input(g, pl.layout, x.in, call.input().nbytes());
      gpu::reduce_scatter(g, in, pl.elems, x.out, x.t, reduce_of(x.op), numerics_of(x.numerics));
    });
    return true;
  }

  bool all_reduce(Call& call, const AllReduceExchange& x) override {
    NcclGroup& g = group_of(call);
    run(call, g, [&] {
      gpu::all_reduce(g, x.in, x.out, x.n, x.t, reduce_of(x.op), numerics_of(x.numerics));
    });
    return true;
  }

  bool all_to_all(Call& call, const AllToAllExchange& x) override {
    NcclGroup& g = group_of(call);
    const detail::AllToAllPlan& pl = *x.plan;
    run(call, g, [&] {
      const std::byte* in = packed_input(g, pl.send, x.in, call.input().nbytes());
      std::byte* out =
          pl.recv.direct() ? x.out : g.workspace(bytes_of(pl.out_shape, x.t), kReceived);
      gpu::all_to_all(g, in, pl.send_elems, out, pl.recv_elems, x.t);
      if (!pl.recv.direct()) move_blocks<false>(pl.recv, out, x.out, g.stream());
    });
    return true;
  }

  bool broadcast(Call& call, const BroadcastExchange& x) override {
    NcclGroup& g = group_of(call);
    run(call, g, [&] { gpu::broadcast(g, x.in, x.out, x.n, x.t, x.root); });
    return true;
  }
};

}  // namespace

detail::Path& device_path() {
  static DevicePath path;
  return path;
}

void install_device_path() {
  static const bool installed = [] {
    detail::register_path(device_path());
    return true;
  }();
  (void)installed;
}

}  // namespace meshtest::dist::gpu
