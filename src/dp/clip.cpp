// clip_coefficients element-wise.
#include "src/dp/clip.hpp"

#include <cmath>

#include "src/ops/visit_real.hpp"

namespace meshtest::dp {

void check_clip(double clip, const char* who) {
  MESHTEST_CHECK(std::isfinite(clip) && clip > 0, "{}: clip norm C is {}, expected a finite C > 0",
                 who, clip);
}

Tensor clip_coefficients(const Tensor& norms, double clip) {
  check_clip(clip, "clip_coefficients");
  MESHTEST_CHECK(norms.rank() == 1, "clip_coefficients: norms have shape {}, expected [B]",
                 norms.shape());
  Tensor c(norms.shape(), norms.dtype());
  visit_real(norms.dtype(), "clip_coefficients", [&]<class S>(type_tag<S>) {
    c.vector<S>() = norms.vector<S>().unaryExpr(
        [&](S n) { return std::min(S(1), static_cast<S>(clip) / (n + static_cast<S>(kClipEps))); });
  });
  return c;
}

}  // namespace meshtest::dp
