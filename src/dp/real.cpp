// seq_dims and the sample-layout checks shared by the DP kernels.
#include "src/dp/real.hpp"

namespace meshtest::dp {

SeqDims seq_dims(const Tensor& t, std::string_view op, std::string_view name) {
  MESHTEST_CHECK(t.rank() == 2 || t.rank() == 3,
                 "{}: {} has shape {}, expected [B, d] or [B, T, d]", op, name, t.shape());
  if (t.rank() == 2) return {.batch = t.shape()[0], .seq = 1, .features = t.shape()[1]};
  MESHTEST_CHECK(t.shape()[1] > 0, "{}: {} has shape {} with T = 0, expected T >= 1", op, name,
                 t.shape());
  return {.batch = t.shape()[0], .seq = t.shape()[1], .features = t.shape()[2]};
}

void check_same_samples(std::string_view op, const Tensor& a, const Tensor& b) {
  const SeqDims da = seq_dims(a, op, "activations");
  const SeqDims db = seq_dims(b, op, "output grads");
  MESHTEST_CHECK(a.rank() == b.rank() && da.batch == db.batch && da.seq == db.seq,
                 "{}: activations {} and output grads {} differ in B or T", op, a.shape(),
                 b.shape());
  MESHTEST_CHECK(a.dtype() == b.dtype(), "{}: activations are {} but output grads are {}", op,
                 a.dtype(), b.dtype());
}

}  // namespace meshtest::dp
