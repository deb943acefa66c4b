// Trace without MPI: steps recorded by stand-in ops (a CCL-like step, a compute step with
// several inputs and outputs), replay order and op types, ownership checks.
#include "src/perf/trace.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "src/perf/profiler.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::perf {
namespace test_trace {

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

// A traceable stand-in compute op with 2 inputs and 3 outputs: sum = a + b, diff = a - b,
// prod = a * b (f32, same shapes). The step's run recomputes into the same output buffers.
std::vector<Tensor> sum_diff_prod(const Tensor& a, const Tensor& b) {
  std::vector<Tensor> out;
  for (int i = 0; i < 3; ++i) out.emplace_back(a.shape(), a.dtype());
  auto run = [pa = a.data<float>(), pb = b.data<float>(), s = out[0].data<float>(),
              d = out[1].data<float>(), p = out[2].data<float>(), n = a.numel()] {
    for (std::int64_t i = 0; i < n; ++i) {
      s[i] = pa[i] + pb[i];
      d[i] = pa[i] - pb[i];
      p[i] = pa[i] * pb[i];
    }
  };
  run();
  if (Trace* t = Trace::active()) {
    t->add_step("sum_diff_prod", OpType::compute, {&a, &b}, {&out[0], &out[1], &out[2]}, run);
  }
  return out;
}

TEST(Trace, ComputeStepWithTwoInputsAndThreeOutputsReplaysBitForBit) {
  Trace t;
  Tensor& a = t.input(Tensor::from_vector<float>(Shape{2, 2}, {1.5f, -2, 0.1f, 3}));
  Tensor& b = t.input(Tensor::from_vector<float>(Shape{2, 2}, {0.25f, 4, 0.7f, -1}));
  std::vector<Tensor*> kept;
  t.capture([&] {
    for (Tensor& o : sum_diff_prod(a, b)) kept.push_back(&t.keep(std::move(o)));
  });
  ASSERT_EQ(t.size(), 1u);
  ASSERT_EQ(kept.size(), 3u);
  // New inputs in place; the expected values are plain loops over them.
  a.span<float>()[0] = 7.125f;
  b.span<float>()[3] = 0.3f;
  std::vector<Tensor> expected(3, Tensor(Shape{2, 2}, DType::f32));
  for (std::int64_t i = 0; i < 4; ++i) {
    const float x = a.span<float>()[i], y = b.span<float>()[i];
    expected[0].span<float>()[i] = x + y;
    expected[1].span<float>()[i] = x - y;
    expected[2].span<float>()[i] = x * y;
  }
  for (Tensor* k : kept) k->fill(std::numeric_limits<double>::quiet_NaN());
  const Session session;
  t.replay();
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(kept[i]->bitwise_equal(expected[i])) << i;
  // The profiler shows the replayed step as a compute op with its inputs and outputs.
  const std::vector<OpRecord> r = records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op_code, "sum_diff_prod");
  EXPECT_EQ(r[0].op_type, OpType::compute);
  EXPECT_EQ(r[0].inputs.size(), 2u);
  ASSERT_EQ(r[0].outputs.size(), 3u);
  EXPECT_EQ(r[0].outputs[2].shape, (Shape{2, 2}));
}

TEST(Trace, CclStepsReplayAsCcl) {
  Trace t;
  Tensor& x = t.input(Tensor::from_vector<float>(Shape{1}, {1}));
  t.capture([&] { t.keep(add_one(x, nullptr)); });
  const Session session;
  t.replay();
  const std::vector<OpRecord> r = records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op_type, OpType::ccl);  // the old signature records a CCL step
}

TEST(Trace, OwnershipErrors) {
  {
    // A compute step whose second input is not the trace's: named by its index and shape.
    Trace t;
    Tensor& a = t.input(Tensor(Shape{3}, DType::f32));
    const Tensor outside(Shape{3}, DType::f32);
    expect_error(
        [&] {
          t.capture([&] {
            for (Tensor& o : sum_diff_prod(a, outside)) t.keep(std::move(o));
          });
        },
        {"step 0 (sum_diff_prod): its input 1 (f32 [3]) is a tensor the trace does not own"});
    EXPECT_EQ(t.size(), 0u);
  }
  {
    // One of three outputs not kept.
    Trace t;
    Tensor& a = t.input(Tensor(Shape{3}, DType::f32));
    expect_error(
        [&] {
          t.capture([&] {
            std::vector<Tensor> o = sum_diff_prod(a, a);
            t.keep(std::move(o[0]));
            t.keep(std::move(o[2]));
          });
        },
        {"step 0 (sum_diff_prod): its output 1 (f32 [3]) is a tensor the trace does not own"});
  }

  std::vector<std::string>* none = nullptr;
  {
    Trace t;
    Tensor& x = t.input(Tensor(Shape{2}, DType::f32));
    expect_error([&] { t.capture([&] { (void)add_one(x, none); }); },
                 {"step 0 (add_one): its output 0 (f32 [2]) is a tensor the trace does not own"});
    EXPECT_EQ(t.size(), 0u);
  }
  {
    Trace t;
    const Tensor outside(Shape{2}, DType::f32);
    expect_error([&] { t.capture([&] { t.keep(add_one(outside, none)); }); },
                 {"step 0 (add_one): its input 0 (f32 [2]) is a tensor the trace does not own"});
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

}  // namespace test_trace
}  // namespace meshtest::perf
