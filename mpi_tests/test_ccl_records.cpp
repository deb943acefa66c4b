// The CCLs record themselves in the profiler (op type ccl, op code = function name, inputs,
// outputs, attributes), eagerly and from cached plans alike, and trace replay records its steps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/ccl/ccl.hpp"
#include "src/core/tensor.hpp"
#include "src/perf/profiler.hpp"
#include "src/perf/trace.hpp"

namespace meshtest::dist {
namespace {

TEST(CclRecords, EveryCclRecordsOpTypeShapesAndAttributes) {
  const MeshDevice mesh = MeshDevice::line();
  const int p = mesh.size();
  const Tensor x(Shape{3, 2 * p}, DType::f32);
  const perf::Session session;
  for (int round = 0; round < 2; ++round) {  // the second round runs from cached plans
    (void)all_gather(mesh, x, {.dim = 1});
    (void)reduce_scatter(mesh, x, {.dim = 1, .op = ReduceOp::max});
    (void)all_reduce(mesh, x);
    (void)all_to_all(mesh, x, {.split_dim = 1, .concat_dim = 0});
  }
  const std::vector<perf::OpRecord> rs = perf::records();
  ASSERT_EQ(rs.size(), 8u);
  const std::vector<std::string> ops{"all_gather", "reduce_scatter", "all_reduce", "all_to_all"};
  const std::vector<Shape> outs{Shape{3, 2 * p * p}, Shape{3, 2}, Shape{3, 2 * p}, Shape{3 * p, 2}};
  const std::vector<std::string> attrs{"axis=all;dim=1", "axis=all;dim=1;op=max", "axis=all;op=sum",
                                       "axis=all;split_dim=1;concat_dim=0"};
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const perf::OpRecord& r = rs[i];
    SCOPED_TRACE(r.op_code);
    EXPECT_EQ(r.op_code, ops[i % 4]);
    EXPECT_EQ(r.op_type, perf::OpType::ccl);
    ASSERT_EQ(r.inputs.size(), 1u);
    EXPECT_EQ(r.inputs[0].shape, x.shape());
    ASSERT_EQ(r.outputs.size(), 1u);
    EXPECT_EQ(r.outputs[0].shape, outs[i % 4]);
    EXPECT_EQ(r.outputs[0].dtype, DType::f32);
    EXPECT_EQ(r.attributes, attrs[i % 4]);
    EXPECT_GE(r.end_ns, r.start_ns);
  }
}

TEST(CclRecords, ReplayRecordsItsSteps) {
  const MeshDevice mesh = MeshDevice::line();
  perf::Trace trace;
  Tensor& x = trace.input(Tensor(Shape{2, mesh.size()}, DType::f32));
  trace.capture([&] {
    const Tensor& g = trace.keep(all_gather(mesh, x, {.dim = 0}));
    trace.keep(all_reduce(mesh, g));
  });
  const perf::Session session;
  trace.replay();
  const std::vector<perf::OpRecord> rs = perf::records();
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].op_code, "all_gather");
  EXPECT_EQ(rs[1].op_code, "all_reduce");
  EXPECT_EQ(rs[1].op_type, perf::OpType::ccl);
}

}  // namespace
}  // namespace meshtest::dist
