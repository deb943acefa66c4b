// exchange: the raw collectives on device buffers over one NCCL group of a mesh — reductions with
// the CPU path's bits or with NCCL's own arithmetic, and the copies (all_gather, all_to_all(_v),
// broadcast). The front ends on DeviceTensor (agreement, dims, options) are built on these.
//
// Every function here is collective over the devices of `g` (each calls it with the same
// arguments but its own buffers), and asynchronous: it queues its work on g.stream() and
// returns; the outputs are ready after g.synchronize() or for work queued on g.stream() later.
// The inputs must be ready for g.stream() (written by finished work, or by work queued earlier
// on g.stream()), and every buffer must stay allocated until the work has finished. Buffers are
// device pointers on the calling thread's current device (the rank's GPU). Blocks are laid end
// to end: `counts` (Counts) gives p element counts, block j for, or from, the device with axis
// index j (uneven counts follow whatever rule the caller split by, e.g. array_split).
//
// Checks here are local (sizes, dtype and op, pointers) and throw meshtest::Error before anything
// is queued; they assume the group has agreed on the call (the front end's job): devices that
// pass different counts, dtypes or ops are not detected here.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "dist/ccl/options.hpp"
#include "dist/gpu/ccl/nccl_comm.hpp"
#include "src/core/dtype.hpp"
#include "src/gpu/reduce.hpp"

namespace meshtest::dist::gpu {

/// The reduction operators: sum, max, min, avg (src/gpu/reduce.hpp).
using Reduce = meshtest::gpu::Reduce;

/// The GPU reduction of a collective's reduce op, and back: the same operators, in one order.
constexpr Reduce reduce_of(ReduceOp op) { return static_cast<Reduce>(op); }
constexpr ReduceOp reduce_op_of(Reduce op) { return static_cast<ReduceOp>(op); }
static_assert(reduce_of(ReduceOp::sum) == Reduce::sum && reduce_of(ReduceOp::max) == Reduce::max &&
                  reduce_of(ReduceOp::min) == Reduce::min &&
                  reduce_of(ReduceOp::avg) == Reduce::avg,
              "ReduceOp and gpu::Reduce list their operators in one order");

/// The arithmetic of a reduction.
enum class Numerics {
  /// The CPU path's bits (dist/ccl/reduce.hpp): each device receives its block from every other
  /// device (grouped ncclSend / ncclRecv into staging memory: (p-1)/p of the input in, the ring's
  /// bytes) and reduces the p blocks in axis order with gpu::reduce_terms (its own block read in
  /// place). bf16 and f16 accumulate in f32 and round once; avg divides in f32 (f64 for f64).
  /// A sum over two devices is NCCL's own (ncclAllReduce, ncclReduceScatter): one addition per
  /// element, so the same bits, in NCCL's time; only a NaN sum differs, NCCL's being the default
  /// NaN where the kernel keeps the NaN term's payload and sign.
  exact,
  /// NCCL's reductions (ncclReduceScatter, ncclAllReduce, ncclReduce; ncclAvg for avg): NCCL's
  /// order of additions and roundings, which vary with its algorithm, protocol and p (bf16 and f16
  /// are rounded after each step). Equal to exact where neither order nor rounding can matter:
  /// integer sums, max and min of values without NaN or zeros of both signs.
  nccl,
};

/// Element counts of the p blocks of a buffer, laid end to end in axis order.
using Counts = std::span<const std::int64_t>;

/// Reduces block j of every device's `in` (counts[j] elements) into `out` on device j:
/// counts[index] elements. `out` is disjoint from `in` or is exactly this device's own block of
/// it (in place). u8 cannot be reduced; avg needs a floating t.
void reduce_scatter(NcclGroup& g, const std::byte* in, Counts counts, std::byte* out, DType t,
                    Reduce op, Numerics numerics = Numerics::exact);

/// The element-wise reduction of every device's `in` (n elements) into `out` on every device;
/// out == in (in place) or disjoint. exact: the reduce_scatter above over the array_split
/// blocks of n, then an all_gather of the reduced blocks (ncclAllGather for equal blocks, in
/// place; grouped ncclSend / ncclRecv otherwise): every device gets the same bits.
void all_reduce(NcclGroup& g, const std::byte* in, std::byte* out, std::int64_t n, DType t,
                Reduce op, Numerics numerics = Numerics::exact);

/// Every device's `in` (counts[index] elements of t) laid end to end in axis order in `out`
/// (the sum of counts): ncclAllGather for equal counts, otherwise one group of ncclSend /
/// ncclRecv, this device's own block sent to itself in it unless in place. `in` is this device's
/// own block of out (in place) or disjoint from out.
void all_gather(NcclGroup& g, const std::byte* in, Counts counts, std::byte* out, DType t);

/// Block j of `in` (send_counts[j] elements) goes to device j; block i of `out`
/// (recv_counts[i] elements) comes from device i, whose send_counts[index] it must equal.
/// One group of ncclSend / ncclRecv, a device's own block included (NCCL copies it in the same
/// launch); in and out disjoint.
void all_to_all(NcclGroup& g, const std::byte* in, Counts send_counts, std::byte* out,
                Counts recv_counts, DType t);

/// The root's `in` (n elements; read on the root only, may equal out) into `out` on every
/// device: ncclBroadcast. root is an axis index in [0, p).
void broadcast(NcclGroup& g, const std::byte* in, std::byte* out, std::int64_t n, DType t,
               int root);

/// NCCL's datatype of t: f32 ncclFloat32, f64 ncclFloat64, bf16 ncclBfloat16, f16 ncclFloat16,
/// i32 ncclInt32, i64 ncclInt64, u8 ncclUint8.
ncclDataType_t nccl_type(DType t);

/// NCCL's operator of op: sum ncclSum, max ncclMax, min ncclMin, avg ncclAvg.
ncclRedOp_t nccl_op(Reduce op);

}  // namespace meshtest::dist::gpu
