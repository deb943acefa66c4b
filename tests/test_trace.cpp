// Trace without MPI: steps recorded by a stand-in op, replay order, ownership checks.
#include "src/perf/trace.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/expect_error.hpp"

namespace meshtest::perf {
namespace {

using test_support::expect_error;

// A traceable stand-in op: out = x + 1 (f32), recorded as a step while a capture is active.
Tensor add_one(const Tensor& x, std::vector<std::string>* log) {
  Tensor out(x.shape(), x.dtype());
  auto run = [in = x.data<float>(), o = out.data<float>(), n = x.numel(), log] {
    for (std::int64_t i = 0; i < n; ++i) o[i] = in[i] + 1;
    if (log) log->push_back("add_one");
  };
  run();
  if (Trace* t = Trace::active()) t->add_step("add_one", x, out, run);
  return out;
}

TEST(Trace, ReplayRerunsTheStepsOnTheSameBuffers) {
  Trace t;
  Tensor& x = t.input(Tensor::from_vector<float>(Shape{3}, {1, 2, 3}));
  Tensor* z = nullptr;
  std::vector<std::string> log;
  t.capture([&] {
    Tensor& y = t.keep(add_one(x, &log));
    z = &t.keep(add_one(y, &log));
  });
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.ops(), (std::vector<std::string>{"add_one", "add_one"}));
  EXPECT_EQ(z->span<float>()[2], 5.0f);
  x.span<float>()[2] = 10;  // the caller updates the input in place
  t.replay();
  EXPECT_EQ(z->span<float>()[0], 3.0f);
  EXPECT_EQ(z->span<float>()[2], 12.0f);
  EXPECT_EQ(log.size(), 4u);
  EXPECT_EQ(Trace::active(), nullptr);
}

TEST(Trace, OwnershipErrors) {
  std::vector<std::string>* none = nullptr;
  {
    Trace t;
    Tensor& x = t.input(Tensor(Shape{2}, DType::f32));
    expect_error([&] { t.capture([&] { (void)add_one(x, none); }); },
                 {"step 0 (add_one) writes its output into a tensor the trace does not own"});
    EXPECT_EQ(t.size(), 0u);
  }
  {
    Trace t;
    const Tensor outside(Shape{2}, DType::f32);
    expect_error([&] { t.capture([&] { t.keep(add_one(outside, none)); }); },
                 {"step 0 (add_one) reads a tensor the trace does not own"});
  }
  {
    Trace t;
    Tensor& x = t.input(Tensor(Shape{2}, DType::f32));
    t.capture([&] { t.keep(add_one(x, none)); });
    expect_error([&] { t.capture([] {}); }, {"already holds 1 steps"});
    Trace inner;
    expect_error(
        [&] {
          inner.capture([&] {
            Trace other;
            other.capture([] {});
          });
        },
        {"another capture is active"});
    EXPECT_EQ(Trace::active(), nullptr);
  }
}

}  // namespace
}  // namespace meshtest::perf
