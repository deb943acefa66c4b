// moe_kernel: what moe.cpp hands to the kernels of moe_kernel.cu (the router, the expert counts,
// the permutation and its inverse). Plain types only, so that nvcc compiles no Eigen or fmt.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace meshtest::gpu::detail {

/// The stored type of the router's tensors; bf16 computes in f32, f64 in f64.
enum class RouterFloat : std::uint8_t { f32, f64, bf16 };

/// Sentinel of the "first bad index" flags below: no bad index found.
inline constexpr unsigned long long kNoIndex = ~0ULL;

/// Queues the router on `stream`, one thread per token t < tokens of logits [tokens, experts]:
/// experts[t, j] (i64) = the j-th largest logit's expert (equal logits: lower expert first) for
/// j < k; weights[t, j] (the logits' type) = softmax over the k chosen logits (`softmax_first`
/// false), or the full row's softmax at the chosen experts, divided by their sum when
/// `renormalize` (`softmax_first` true); sums run in the compute type, j and expert ascending.
/// A row holding a NaN is skipped and the smallest flat index of a NaN lowered into *nan_at
/// (set to kNoIndex before). Returns the launch's error.
cudaError_t launch_gate(RouterFloat t, const void* logits, std::int64_t tokens,
                        std::int64_t experts, std::int64_t k, bool softmax_first, bool renormalize,
                        std::int64_t* chosen, void* weights, unsigned long long* nan_at,
                        cudaStream_t stream);

/// Queues probs[t, e] = softmax of logits row t at e, in the compute type (f32 for f32 and
/// bf16, f64 for f64: probs holds that type), the sum over e ascending; NaNs as launch_gate.
/// Returns the launch's error.
cudaError_t launch_router_probabilities(RouterFloat t, const void* logits, std::int64_t tokens,
                                        std::int64_t experts, void* probs,
                                        unsigned long long* nan_at, cudaStream_t stream);

/// Queues the column means of probs [tokens, experts] (f32 or f64, `f64`), each summed in f64
/// over t ascending and divided by tokens, into means [experts] (f64). Returns the launch's error.
cudaError_t launch_column_means(bool f64, const void* probs, std::int64_t tokens,
                                std::int64_t experts, double* means, cudaStream_t stream);

/// Queues counts[e] (u64, zeroed before) = slots s < slots_n with chosen[s] == e, and the
/// smallest slot whose expert is outside [0, experts) lowered into *bad_at. Returns the launch's
/// error.
cudaError_t launch_expert_counts(const std::int64_t* chosen, std::int64_t slots_n,
                                 std::int64_t experts, unsigned long long* counts,
                                 unsigned long long* bad_at, cudaStream_t stream);

/// Queues the permutation of a routing whose experts were counted: offsets[0] = 0, offsets[e+1]
/// = offsets[e] + counts[e]; slots[offsets[e] + i] = the i-th slot (ascending) routed to e, and
/// row_of_slot[s] = the row holding slot s. Returns the launch's error.
cudaError_t launch_permutation(const std::int64_t* chosen, std::int64_t slots_n,
                               std::int64_t experts, const unsigned long long* counts,
                               std::int64_t* offsets, std::int64_t* slots,
                               std::int64_t* row_of_slot, cudaStream_t stream);

/// Queues out[i, :] = x[slots[i] / k, :] for i < rows, rows of `row_bytes` bytes (a multiple of
/// `element_bytes`: 1, 2, 4 or 8). Returns the launch's error.
cudaError_t launch_gather_rows(const void* x, const std::int64_t* slots, std::int64_t rows,
                               std::int64_t k, std::int64_t row_bytes, int element_bytes, void* out,
                               cudaStream_t stream);

/// Queues out[t, c] = sum over j < k ascending of weights[t, j] * y[row_of_slot[t k + j], c]
/// (slots with row -1 add nothing), from 0, each product and sum rounded in the compute type
/// (no fused multiply-add) and the result rounded once to the stored type, for t < tokens,
/// c < cols. Returns the launch's error.
cudaError_t launch_unpermute(RouterFloat t, const void* y, const std::int64_t* row_of_slot,
                             const void* weights, std::int64_t tokens, std::int64_t k,
                             std::int64_t cols, void* out, cudaStream_t stream);

/// Queues keep[i] (u8) for the rows i < rows of a permutation (slots, offsets [experts + 1]):
/// 1 where row i's expert holds at most `capacity` rows; else, by slot order (`lowest_weight`
/// false: the segment's first `capacity` rows) or by weight (the `capacity` rows of largest
/// weights[slot], equal weights: lower slot first). weights: [T k] of type t (read when
/// lowest_weight). Returns the launch's error.
cudaError_t launch_capacity_keep(const std::int64_t* slots, const std::int64_t* offsets,
                                 std::int64_t experts, std::int64_t rows, std::int64_t capacity,
                                 bool lowest_weight, RouterFloat t, const void* weights,
                                 std::uint8_t* keep, cudaStream_t stream);

/// Queues the kept rows' compaction: new_slots[new_offsets[e] + (kept rows of e before i)] =
/// slots[i] for every kept row i of expert e, row_of_slot[slots[i]] = that row, and -1 for a
/// dropped one. Returns the launch's error.
cudaError_t launch_capacity_compact(const std::int64_t* slots, const std::int64_t* offsets,
                                    std::int64_t experts, std::int64_t rows,
                                    const std::uint8_t* keep, const std::int64_t* new_offsets,
                                    std::int64_t* new_slots, std::int64_t* row_of_slot,
                                    cudaStream_t stream);

/// Queues the smallest index i < n with values[i] NaN (values of type t) lowered into *nan_at.
/// Returns the launch's error.
cudaError_t launch_find_nan(RouterFloat t, const void* values, std::int64_t n,
                            unsigned long long* nan_at, cudaStream_t stream);

/// Queues the MoE backward's per-slot terms (f32) for the rows i < rows of a permutation (slots,
/// offsets [experts + 1]), from grad_rows [rows, h] (grad_out of each row's token), y [rows, h]
/// (the expert outputs without bias), mlp2_bias [experts, h] (null: zero) and the routing
/// weights [T k]:
///   grad_weights[slots[i]] = Σ_c grad_rows[i, c] (y[i, c] + b2[e, c])   (c ascending),
///   dy[i, c] = weights[slots[i]] · grad_rows[i, c].   Returns the launch's error.
cudaError_t launch_slot_terms(const std::int64_t* slots, const std::int64_t* offsets,
                              std::int64_t experts, std::int64_t rows, std::int64_t h,
                              const float* grad_rows, const float* y, const float* mlp2_bias,
                              const float* weights, float* grad_weights, float* dy,
                              cudaStream_t stream);

/// Queues sums[e, c] = Σ over the rows i of segment e (offsets [experts + 1], ascending) of
/// x[i, c], 0 for an empty segment (x [rows, cols], f32). Returns the launch's error.
cudaError_t launch_segment_column_sums(const float* x, const std::int64_t* offsets,
                                       std::int64_t experts, std::int64_t cols, float* sums,
                                       cudaStream_t stream);

/// The chunks of a grouped GEMM whose segments stay on the device (gpu::grouped_gemm with device
/// offsets, experts.hpp). The segments' bounds [groups + 1] are offsets [groups + 1] (i64, read on
/// the device) clamped into a partition of [0, rows] (each bound at least the one before, at most
/// rows; the first 0); segment e is cut into chunks of `chunk` rows (the last one partial),
/// numbered from chunk_start[e] (chunk_start [groups + 1], a prefix sum). Chunk c reads the
/// `chunk` rows of x from first_row[c] = min(its first row, rows - chunk) (chunk <= rows: a
/// partial chunk also reads rows of other segments, whose products are never read) and writes
/// rows [c chunk, (c + 1) chunk) of the scratch. Queues, for c < max_chunks (at least
/// ceil(rows / chunk) + groups, so that every partition fits): x_rows[c] = x + first_row[c]
/// x_row_bytes, w_rows[c] = w + e w_group_bytes, out_rows[c] = scratch + c chunk
/// scratch_row_bytes (the chunks past the last one: x's first rows and group 0, computed and
/// never read), and bounds, chunk_start and first_row [max_chunks]. The smallest index e whose
/// offset was clamped (groups when the last bound is not rows) is lowered into *bad_at. One
/// block. Returns the launch's error.
cudaError_t launch_chunk_plan(const std::int64_t* offsets, std::int64_t groups, std::int64_t rows,
                              std::int64_t chunk, std::int64_t max_chunks, const void* x,
                              std::int64_t x_row_bytes, const void* w, std::int64_t w_group_bytes,
                              void* scratch, std::int64_t scratch_row_bytes, const void** x_rows,
                              const void** w_rows, void** out_rows, std::int64_t* bounds,
                              std::int64_t* chunk_start, std::int64_t* first_row,
                              unsigned long long* bad_at, cudaStream_t stream);

/// Queues y[r, n] = scratch[r's row in its chunk, n] + bias[e, n] (bias null: nothing added),
/// summed in f32 and rounded once to y's type (bf16 when `bf16`, else f32), for every row r of a
/// segment e of the plan of launch_chunk_plan (bounds, chunk_start, first_row) and n < cols;
/// scratch: f32 [max_chunks chunk, cols]; bias: [groups, cols] of y's type. Rows past the last
/// bound are not written. Returns the launch's error.
cudaError_t launch_chunk_gather(const std::int64_t* bounds, std::int64_t groups, std::int64_t rows,
                                std::int64_t cols, std::int64_t chunk,
                                const std::int64_t* chunk_start, const std::int64_t* first_row,
                                const float* scratch, bool bf16, const void* bias, void* y,
                                cudaStream_t stream);

/// The decoded type of mxfp4_decode.
enum class DecodedFloat : std::uint8_t { f32, f64, bf16, f16 };

/// Queues the decode of MXFP4 (blocks u8 [nblocks, 16], two e2m1 codes a byte, low nibble
/// first; scales u8 [nblocks], e8m0) into out [nblocks * 32] of type t: each value e2m1(code) *
/// 2^(s - 127), exact in f64 and rounded once to nearest even (Inf past the type's range) from
/// there, as the host's conversion does. Returns the launch's error.
cudaError_t launch_mxfp4_decode(const std::uint8_t* blocks, const std::uint8_t* scales,
                                std::int64_t nblocks, DecodedFloat t, void* out,
                                cudaStream_t stream);

}  // namespace meshtest::gpu::detail
