// within_model and the expected-error checks.
#include "dist/testing/harness/expect.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/testing/harness/harness.hpp"
#include "src/check/compare.hpp"
#include "src/check/tolerance.hpp"
#include "src/core/error.hpp"

namespace meshtest::dist::testing {

namespace {

/// The assertion of comparison c of got under `model`; the bound at the worst element from
/// `scale_at_worst`.
::testing::AssertionResult verdict(const Comparison& c, const ErrorModel& model,
                                   double scale_at_worst) {
  if (c.passed) return ::testing::AssertionSuccess();
  std::string where = "no element";
  if (c.worst_index >= 0) {
    const double bound = error_bound(model, scale_at_worst, c.expected_at_worst);
    where = fmt::format(
        "worst element {} [{}]: got {:.9g}, expected {:.9g}, |difference| {:.3g} > bound {:.3g}",
        c.worst_index, fmt::join(c.worst_coord, ", "), c.got_at_worst, c.expected_at_worst,
        std::abs(c.got_at_worst - c.expected_at_worst), bound);
  }
  return ::testing::AssertionFailure()
         << "on device " << world_rank() << " of " << world_size() << ": " << where << " ("
         << (c.nan_or_inf_count > 0 ? fmt::format("{} NaN/Inf; ", c.nan_or_inf_count) : "")
         << "model " << model.str() << ")\n"
         << c.str();
}

ErrorModel model_of(DType dtype, const Terms& t) {
  return {.dtype = dtype,
          .terms = t.terms,
          .roundings = t.roundings,
          .reference = Reference::exact,
          .lambda = t.lambda};
}

}  // namespace

::testing::AssertionResult within_model(const Tensor& got, const HostReference& reference,
                                        const std::vector<Tensor>& inputs, const Terms& terms) {
  std::vector<Tensor> exact, magnitudes;
  for (const Tensor& t : inputs) {
    exact.push_back(t.astype(DType::f64));
    magnitudes.push_back(magnitude(t));
  }
  const Tensor expected = reference(exact);
  const Tensor scale = reference(magnitudes);
  const ErrorModel model = model_of(got.dtype(), terms);
  const Comparison c = compare(expected, got, model, scale);
  return verdict(c, model, c.worst_index >= 0 ? scale.item(c.worst_index) : 0.0);
}

::testing::AssertionResult within_model(const Tensor& got, const Tensor& expected,
                                        const Terms& terms, double scale) {
  const ErrorModel model = model_of(got.dtype(), terms);
  if (scale < 0) {
    const Comparison c = compare(expected, got, model);
    double max_abs = 0;
    for (std::int64_t i = 0; i < expected.numel(); ++i) {
      max_abs = std::max(max_abs, std::abs(expected.item(i)));
    }
    return verdict(c, model, max_abs);
  }
  return verdict(compare(expected, got, model, scale), model, scale);
}

std::string error_message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (!msg.starts_with("[rank ")) return msg;
    const std::size_t end = msg.find("] ");
    return end == std::string::npos ? msg : msg.substr(end + 2);
  }
  return {};
}

::testing::AssertionResult error_with(const std::string& message, const std::string& fragment) {
  if (message.empty()) {
    return ::testing::AssertionFailure()
           << "no meshtest::Error; wanted one containing \"" << fragment << "\"";
  }
  if (message.find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "the meshtest::Error \"" << message << "\" lacks \"" << fragment << "\"";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace meshtest::dist::testing
