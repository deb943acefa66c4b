// attention_mask: the additive [Tq, Tk] mask of key_visible and key padding.
#include "src/ops/attention_mask.hpp"

#include <limits>

#include "src/ops/compute.hpp"
#include "src/perf/profiler.hpp"

namespace meshtest {

Tensor attention_mask(std::int64_t tq, std::int64_t tk, const MaskSpec& m, std::int64_t q_offset,
                      std::int64_t k_offset, std::span<const std::uint8_t> key_padding,
                      DType dtype) {
  perf::OpScope scope("attention_mask");
  scope.attr("causal", m.causal)
      .attr("window", m.sliding_window)
      .attr("q_offset", q_offset)
      .attr("k_offset", k_offset);
  MESHTEST_CHECK(tq >= 0 && tk >= 0, "attention_mask: Tq {} and Tk {} must be >= 0", tq, tk);
  MESHTEST_CHECK(m.sliding_window >= 0, "attention_mask: sliding_window is {}, expected >= 0",
                 m.sliding_window);
  MESHTEST_CHECK(key_padding.empty() || static_cast<std::int64_t>(key_padding.size()) == tk,
                 "attention_mask: key_padding has {} entries, expected 0 or Tk = {}",
                 key_padding.size(), tk);
  Tensor out(Shape{tq, tk}, dtype, Tensor::Uninitialized{});
  detail::visit_floating(dtype, "attention_mask", [&]<class S>(type_tag<S>) {
    const S masked = static_cast<S>(-std::numeric_limits<float>::infinity());
    S* p = out.data<S>();
    for (std::int64_t i = 0; i < tq; ++i) {
      for (std::int64_t j = 0; j < tk; ++j) {
        const bool padded = !key_padding.empty() && key_padding[j] != 0;
        p[i * tk + j] = !padded && key_visible(q_offset + i, k_offset + j, m) ? S(0) : masked;
      }
    }
  });
  scope.output(out);
  return out;
}

}  // namespace meshtest
