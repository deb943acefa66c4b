// seq_dims and the sample-layout checks shared by the DP kernels.
#include "src/dp/real.hpp"

namespace meshtest::dp {

SeqDims seq_dims(const Shape& s, std::string_view op, std::string_view name) {
  MESHTEST_CHECK(s.rank() == 2 || s.rank() == 3,
                 "{}: {} has shape {}, expected [B, d] or [B, T, d]", op, name, s);
  if (s.rank() == 2) return {.batch = s[0], .seq = 1, .features = s[1]};
  MESHTEST_CHECK(s[1] > 0, "{}: {} has shape {} with T = 0, expected T >= 1", op, name, s);
  return {.batch = s[0], .seq = s[1], .features = s[2]};
}

SeqDims seq_dims(const Tensor& t, std::string_view op, std::string_view name) {
  return seq_dims(t.shape(), op, name);
}

void check_same_samples(std::string_view op, const Shape& a, DType a_dtype, const Shape& b,
                        DType b_dtype) {
  const SeqDims da = seq_dims(a, op, "activations");
  const SeqDims db = seq_dims(b, op, "output grads");
  MESHTEST_CHECK(a.rank() == b.rank() && da.batch == db.batch && da.seq == db.seq,
                 "{}: activations {} and output grads {} differ in B or T", op, a, b);
  MESHTEST_CHECK(a_dtype == b_dtype, "{}: activations are {} but output grads are {}", op, a_dtype,
                 b_dtype);
}

void check_same_samples(std::string_view op, const Tensor& a, const Tensor& b) {
  check_same_samples(op, a.shape(), a.dtype(), b.shape(), b.dtype());
}

}  // namespace meshtest::dp
