// exchange: block plans, the point-to-point exchange every uneven collective shares, the exact
// reduce-scatter (and the all-reduce built on it), NCCL's reductions and the copies.
#include "dist/gpu/ccl/exchange.hpp"

#include <string_view>
#include <utility>
#include <vector>

#include "dist/mesh/mpi_check.hpp"
#include "src/core/shape.hpp"
#include "src/gpu/reduce.hpp"

namespace meshtest::dist::gpu {
namespace {

/// Byte offsets and sizes of p blocks laid end to end.
struct Blocks {
  std::vector<std::size_t> offsets, sizes;
  std::size_t total = 0;
  bool even = true;  // every block has the same size

  std::size_t offset(int j) const { return offsets[static_cast<std::size_t>(j)]; }
  std::size_t size(int j) const { return sizes[static_cast<std::size_t>(j)]; }
  /// Block j of the buffer at `base`: (pointer, bytes).
  template <class B>
  std::pair<B*, std::size_t> of(B* base, int j) const {
    return {base + offset(j), size(j)};
  }
};

Blocks blocks_of(const NcclGroup& g, Counts counts, DType t, std::string_view what) {
  MESHTEST_DIST_CHECK(static_cast<int>(counts.size()) == g.size(),
                      "{}: {} block counts for a group of {} devices", what, counts.size(),
                      g.size());
  Blocks b;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    MESHTEST_DIST_CHECK(counts[j] >= 0, "{}: block {} has {} elements", what, j, counts[j]);
    b.offsets.push_back(b.total);
    b.sizes.push_back(static_cast<std::size_t>(counts[j]) * dtype_size(t));
    b.total += b.sizes.back();
    b.even = b.even && counts[j] == counts[0];
  }
  return b;
}

void check_buffer(const void* p, std::size_t bytes, std::string_view what, std::string_view name) {
  MESHTEST_DIST_CHECK(p != nullptr || bytes == 0, "{}: {} is null but must hold {} bytes", what,
                      name, bytes);
}

void check_reduction(DType t, Reduce op, std::string_view what) {
  MESHTEST_DIST_CHECK(t != DType::u8,
                      "{}: reduce op {} is not supported for dtype u8 (u8 holds packed formats; "
                      "no reduction is defined)",
                      what, reduce_op_name(reduce_op_of(op)));
  MESHTEST_DIST_CHECK(op != Reduce::avg || is_floating(t),
                      "{}: reduce op avg is not supported for dtype {} (avg is defined for f32, "
                      "f64, bf16 and f16)",
                      what, t);
}

/// Whether NCCL's own sum gives the exact path's bits: over two devices every element is one
/// addition, a_0 + a_1 or a_1 + a_0, whatever NCCL's algorithm (ring, tree) or protocol, and IEEE
/// addition is commutative. bf16 and f16 agree too: the exact path rounds the sum to f32 and then
/// to the dtype, NCCL rounds it once, and rounding to f32 first cannot change the result, since
/// 24 bits >= 2 x 11 + 2 (double rounding is innocuous for +; docs/gpu.md). A NaN sum is the
/// GPU's default NaN there, not the NaN term's payload (the one difference). Max and min are left
/// out (max(+0, -0) depends on the order), and avg (NCCL scales each term first).
bool one_commutative_sum(const NcclGroup& g, Reduce op) {
  return g.size() == 2 && op == Reduce::sum;
}

/// One grouped step in which every device sends `send(j)` = (pointer, bytes) to each other
/// device j and receives `recv(j)` from it; empty messages are left out on both sides (each
/// side knows the size). Peers are visited in a shifted order, so no device is every device's
/// first. With `self`, a device also sends its own block to itself inside the group (NCCL copies
/// it in the same launch, as nccl-tests' all_to_all does), unless it is already in place.
template <class Send, class Recv>
void send_recv(NcclGroup& g, std::string_view what, Send&& send, Recv&& recv, bool self = false) {
  const int p = g.size(), me = g.index();
  const bool copy_self = self && send(me).first != recv(me).first;
  g.grouped(what, [&] {
    for (int k = copy_self ? 0 : 1; k < p; ++k) {
      const int to = (me + k) % p, from = (me - k + p) % p;
      const auto [s, s_bytes] = send(to);
      if (s_bytes > 0) {
        MESHTEST_NCCL(ncclSend(s, s_bytes, ncclUint8, to, g.comm(), g.stream()), g.comm());
      }
      const auto [r, r_bytes] = recv(from);
      if (r_bytes > 0) {
        MESHTEST_NCCL(ncclRecv(r, r_bytes, ncclUint8, from, g.comm(), g.stream()), g.comm());
      }
    }
  });
}

/// The exact reduce-scatter of blocks `b` of `in` into `out` (mine elements).
void reduce_scatter_exact(NcclGroup& g, const std::byte* in, const Blocks& b, std::int64_t mine,
                          std::byte* out, DType t, Reduce op) {
  const int p = g.size(), me = g.index();
  const std::size_t bytes = b.size(me);
  // The block from device j (j != me) lands in slot j of the staging memory, in axis order.
  std::byte* staging = g.workspace(bytes * static_cast<std::size_t>(p - 1));
  auto slot = [&](int j) { return staging + static_cast<std::size_t>(j < me ? j : j - 1) * bytes; };
  send_recv(
      g, "reduce_scatter (exact)", [&](int j) { return b.of(in, j); },
      [&](int j) { return std::pair(slot(j), bytes); });
  if (mine == 0) return;
  std::vector<const std::byte*> terms(static_cast<std::size_t>(p));
  for (int j = 0; j < p; ++j) {
    terms[static_cast<std::size_t>(j)] = j == me ? in + b.offset(me) : slot(j);
  }
  meshtest::gpu::reduce_terms(out, terms, mine, t, op, g.stream());
}

/// Every device's `own` block into its place of `out` on every device.
void gather_blocks(NcclGroup& g, const std::byte* own, const Blocks& b, std::byte* out,
                   std::string_view what) {
  const int me = g.index();
  if (b.total == 0) return;
  if (b.even) {
    g.grouped(what, [&] {
      MESHTEST_NCCL(ncclAllGather(own, out, b.size(0), ncclUint8, g.comm(), g.stream()), g.comm());
    });
    return;
  }
  send_recv(
      g, what, [&](int) { return std::pair(own, b.size(me)); }, [&](int j) { return b.of(out, j); },
      /*self=*/true);
}

}  // namespace

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  fail("dtype {} has no NCCL datatype", static_cast<int>(t));
}

ncclRedOp_t nccl_op(Reduce op) {
  switch (op) {
    case Reduce::sum:
      return ncclSum;
    case Reduce::max:
      return ncclMax;
    case Reduce::min:
      return ncclMin;
    case Reduce::avg:
      return ncclAvg;
  }
  fail("reduce op {} has no NCCL operator", static_cast<int>(op));
}

void reduce_scatter(NcclGroup& g, const std::byte* in, Counts counts, std::byte* out, DType t,
                    Reduce op, Numerics numerics) {
  check_reduction(t, op, "reduce_scatter");
  const Blocks b = blocks_of(g, counts, t, "reduce_scatter");
  const int me = g.index();
  const std::int64_t mine = counts[static_cast<std::size_t>(me)];
  check_buffer(in, b.total, "reduce_scatter", "the input");
  check_buffer(out, b.size(me), "reduce_scatter", "the output");
  if (b.total == 0) return;
  if (numerics == Numerics::exact && !one_commutative_sum(g, op)) {
    return reduce_scatter_exact(g, in, b, mine, out, t, op);
  }
  const ncclDataType_t type = nccl_type(t);
  const ncclRedOp_t nop = nccl_op(op);
  g.grouped("reduce_scatter (NCCL)", [&] {
    if (b.even) {
      MESHTEST_NCCL(ncclReduceScatter(in, out, static_cast<std::size_t>(counts[0]), type, nop,
                                      g.comm(), g.stream()),
                    g.comm());
      return;
    }
    for (int j = 0; j < g.size(); ++j) {  // uneven blocks: one ncclReduce to each device
      const auto count = static_cast<std::size_t>(counts[static_cast<std::size_t>(j)]);
      if (count == 0) continue;
      MESHTEST_NCCL(ncclReduce(in + b.offset(j), j == me ? out : nullptr, count, type, nop, j,
                               g.comm(), g.stream()),
                    g.comm());
    }
  });
}

void all_reduce(NcclGroup& g, const std::byte* in, std::byte* out, std::int64_t n, DType t,
                Reduce op, Numerics numerics) {
  check_reduction(t, op, "all_reduce");
  MESHTEST_DIST_CHECK(n >= 0, "all_reduce: {} elements", n);
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(t);
  check_buffer(in, bytes, "all_reduce", "the input");
  check_buffer(out, bytes, "all_reduce", "the output");
  if (n == 0) return;
  if (numerics == Numerics::nccl || one_commutative_sum(g, op)) {
    g.grouped("all_reduce (NCCL)", [&] {
      MESHTEST_NCCL(ncclAllReduce(in, out, static_cast<std::size_t>(n), nccl_type(t), nccl_op(op),
                                  g.comm(), g.stream()),
                    g.comm());
    });
    return;
  }
  const std::vector<std::int64_t> counts = split_sizes(n, g.size());
  const Blocks b = blocks_of(g, counts, t, "all_reduce");
  const int me = g.index();
  std::byte* own = out + b.offset(me);
  reduce_scatter_exact(g, in, b, counts[static_cast<std::size_t>(me)], own, t, op);
  gather_blocks(g, own, b, out, "all_reduce (exact): all_gather of the reduced blocks");
}

void all_gather(NcclGroup& g, const std::byte* in, Counts counts, std::byte* out, DType t) {
  const Blocks b = blocks_of(g, counts, t, "all_gather");
  check_buffer(in, b.size(g.index()), "all_gather", "the input");
  check_buffer(out, b.total, "all_gather", "the output");
  gather_blocks(g, in, b, out, "all_gather");
}

void all_to_all(NcclGroup& g, const std::byte* in, Counts send_counts, std::byte* out,
                Counts recv_counts, DType t) {
  const Blocks s = blocks_of(g, send_counts, t, "all_to_all (send counts)");
  const Blocks r = blocks_of(g, recv_counts, t, "all_to_all (receive counts)");
  const int me = g.index();
  MESHTEST_DIST_CHECK(
      s.size(me) == r.size(me), "all_to_all: device {} sends itself {} elements but receives {}",
      me, send_counts[static_cast<std::size_t>(me)], recv_counts[static_cast<std::size_t>(me)]);
  check_buffer(in, s.total, "all_to_all", "the input");
  check_buffer(out, r.total, "all_to_all", "the output");
  send_recv(
      g, "all_to_all", [&](int j) { return s.of(in, j); }, [&](int j) { return r.of(out, j); },
      /*self=*/true);
}

void broadcast(NcclGroup& g, const std::byte* in, std::byte* out, std::int64_t n, DType t,
               int root) {
  MESHTEST_DIST_CHECK(root >= 0 && root < g.size(), "broadcast: root {} out of range [0, {})", root,
                      g.size());
  MESHTEST_DIST_CHECK(n >= 0, "broadcast: {} elements", n);
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(t);
  const bool is_root = g.index() == root;
  if (is_root) check_buffer(in, bytes, "broadcast", "the root's input");
  check_buffer(out, bytes, "broadcast", "the output");
  if (n == 0) return;
  g.grouped("broadcast", [&] {
    MESHTEST_NCCL(
        ncclBroadcast(is_root ? in : out, out, bytes, ncclUint8, root, g.comm(), g.stream()),
        g.comm());
  });
}

}  // namespace meshtest::dist::gpu
