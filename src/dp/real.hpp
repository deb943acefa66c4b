// Sequence views of the DP kernels' inputs: B samples of T rows.
#pragma once

#include <cstdint>
#include <string_view>

#include "src/core/tensor.hpp"
#include "src/ops/visit_real.hpp"

namespace meshtest::dp {

/// A batch of sequences: B samples of T rows of d features (T = 1 for a 2-D [B, d] tensor).
struct SeqDims {
  std::int64_t batch = 0;
  std::int64_t seq = 1;
  std::int64_t features = 0;
};

/// The SeqDims of a [B, d] or [B, T, d] tensor; throws Error naming `op` and `name` for another
/// rank or T = 0.
SeqDims seq_dims(const Tensor& t, std::string_view op, std::string_view name);
/// The same from a shape (a device tensor's: src/gpu/dp.hpp).
SeqDims seq_dims(const Shape& s, std::string_view op, std::string_view name);

/// True for a default-constructed Tensor (rank 0, no bytes): "not set", unlike a [0] tensor.
inline bool is_unset(const Tensor& t) { return t.rank() == 0 && t.nbytes() == 0; }

/// Throws Error unless `a` and `b` hold the same B and T and one dtype (f32 or f64).
void check_same_samples(std::string_view op, const Tensor& a, const Tensor& b);
/// The same from shapes and dtypes.
void check_same_samples(std::string_view op, const Shape& a, DType a_dtype, const Shape& b,
                        DType b_dtype);

}  // namespace meshtest::dp
