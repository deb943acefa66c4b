// reduce_terms: the element-wise reduction of p device buffers in axis order, with the CPU
// path's bits (dist/ccl/reduce.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "src/core/dtype.hpp"

namespace meshtest::gpu {

/// The reduction operators.
enum class Reduce { sum, max, min, avg };

/// dst[k] = terms[0][k] op terms[1][k] op ... op terms[p-1][k] for k < n, combined in this
/// order, queued on `stream`, with the same bits as the CPU path's reduction:
///  - bf16 and f16 accumulate all p terms in f32 and round once (to nearest even) at the end;
///  - avg divides the sum by p in the accumulator's type (f32 for bf16, f16 and f32, f64 for f64)
///    before that one rounding; IEEE addition and division, never fused or flushed;
///  - integer sums wrap (two's complement);
///  - max keeps the accumulator unless it compares below the term, min unless the term
///    compares below it: a NaN already in the accumulator stays, a NaN term is skipped, and of
///    -0.0 and +0.0 the earlier term stays;
///  - an addition with one NaN operand gives that NaN made quiet (payload and sign kept), two
///    infinities that cancel give the default NaN (sign set); with two NaN operands, which one
///    survives is unspecified (the CPU path's own vector and scalar code differ there);
///  - bf16 stores any NaN as 0x7fc0 or 0xffc0 by its sign; f16 as src/core/f16_bits.hpp rounds
///    it: a quiet NaN of its sign with the top 9 bits of the f32 payload.
/// `terms` is a host array of p >= 1 device pointers (any p; its contents are read before the
/// call returns); dst may be one of them. The buffers and `stream` are on the current device
/// (or reachable from it). t is not u8, and avg needs a floating t: Error otherwise.
/// Loads and stores 16 bytes at a time when every buffer sits at the same address modulo 16
/// (past a head of a few elements); otherwise one element at a time.
/// Asynchronous: returns once queued (a launch error throws at once; a fault in the kernel
/// surfaces at the stream's next synchronization).
void reduce_terms(std::byte* dst, std::span<const std::byte* const> terms, std::int64_t n, DType t,
                  Reduce op, cudaStream_t stream);

}  // namespace meshtest::gpu
