// Tensor, Shape and the array_split rule.
#include <gtest/gtest.h>

#include <cmath>

#include "src/core/tensor.hpp"

namespace meshtest {
namespace test_tensor {

TEST(SplitRange, FollowsArraySplit) {
  // numpy.array_split(range(10), 4) -> sizes 3, 3, 2, 2
  EXPECT_EQ(split_sizes(10, 4), (std::vector<std::int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(split_range(10, 4, 2), (Range{6, 2}));
  EXPECT_EQ(split_sizes(2, 4), (std::vector<std::int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(split_sizes(0, 3), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_THROW(split_range(4, 0, 0), Error);
  EXPECT_THROW(split_range(4, 2, 2), Error);
}

TEST(Tensor, SliceConcatRoundTripEveryDim) {
  std::vector<std::int32_t> v(2 * 3 * 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>(i);
  const Tensor t = Tensor::from_vector(Shape{2, 3, 5}, v);
  for (int dim = 0; dim < 3; ++dim) {
    for (int p : {1, 2, 3, 4, 7}) {
      auto parts = split(t, p, dim);
      ASSERT_EQ(parts.size(), static_cast<std::size_t>(p));
      EXPECT_TRUE(concat(parts, dim).bitwise_equal(t)) << "dim " << dim << " p " << p;
    }
  }
}

TEST(Tensor, SliceTakesTheRightElements) {
  std::vector<double> v(12);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  const Tensor t = Tensor::from_vector(Shape{3, 4}, v);
  const Tensor s = t.slice(1, 1, 2);  // columns 1..2
  EXPECT_EQ(s.shape(), (Shape{3, 2}));
  EXPECT_EQ(s.span<double>()[0], 1.0);
  EXPECT_EQ(s.span<double>()[1], 2.0);
  EXPECT_EQ(s.span<double>()[2], 5.0);
  EXPECT_EQ(s.span<double>()[5], 10.0);
  EXPECT_EQ(t.matrix<double>()(2, 3), 11.0);
}

TEST(Tensor, BadInputThrows) {
  Tensor t(Shape{2, 3}, DType::f32);
  EXPECT_THROW(t.slice(2, 0, 1), Error);
  EXPECT_THROW(t.slice(1, 2, 2), Error);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.reshape(Shape{4}), Error);
  EXPECT_THROW(concat({t, Tensor(Shape{2, 3}, DType::f64)}, 0), Error);
  EXPECT_THROW(concat({t, Tensor(Shape{3, 3}, DType::f32)}, 1), Error);
  EXPECT_THROW(concat({}, 0), Error);
  EXPECT_THROW(split(t, -1, 0), Error);
  EXPECT_TRUE(split(t, 0, 0).empty());
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7}), Error);
  EXPECT_THROW(dtype_from_name("f8"), Error);
  EXPECT_THROW(dtype_from_name("F16"), Error);
}

TEST(Tensor, AstypeRoundsBf16) {
  const Tensor t = Tensor::from_vector(Shape{3}, std::vector<float>{1.0f, 1.00390625f, 3.5f});
  const Tensor b = t.astype(DType::bf16);
  EXPECT_EQ(b.item(0), 1.0);
  EXPECT_EQ(b.item(1), 1.0);  // 1 + 2^-8 ties to even -> 1
  EXPECT_EQ(b.item(2), 3.5);
}

TEST(Tensor, AstypeToAndFromF16) {
  // From f64: one rounding to nearest even; 1 + 2^-11 + 2^-30 would round to 1 through f32.
  const std::vector<double> v = {1.0,      1 + 0x1p-11, 1 + 0x1p-11 + 0x1p-30, 65520.0,
                                 -65519.0, 0x1p-25,     3 * 0x1p-25,           -0.0,
                                 2049.0,   7.75};
  const std::vector<double> want = {1.0, 1.0,         1 + 0x1p-10, INFINITY, -65504.0,
                                    0.0, 2 * 0x1p-24, -0.0,        2048.0,   7.75};
  const Tensor h = Tensor::from_vector(Shape{2, 5}, v).astype(DType::f16);
  ASSERT_EQ(h.dtype(), DType::f16);
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    EXPECT_EQ(h.item(i), want[static_cast<std::size_t>(i)]) << "element " << i;
  }
  EXPECT_TRUE(std::signbit(h.item(7)));
  // Back to every dtype: floats exactly, integers truncated, bf16 rounded once (7.75 -> 7.75).
  EXPECT_TRUE(h.astype(DType::f64).astype(DType::f16).bitwise_equal(h));
  EXPECT_TRUE(h.astype(DType::f32).astype(DType::f16).bitwise_equal(h));
  EXPECT_EQ(h.astype(DType::f32).item(2), 1 + 0x1p-10);
  EXPECT_EQ(h.astype(DType::bf16).item(9), 7.75);
  EXPECT_EQ(h.astype(DType::bf16).item(2), 1.0);  // 2^-10 is below half of bf16's ulp at 1
  const Tensor ints = Tensor::from_vector<double>(Shape{3}, {-3.5, 2.0, 255.0}).astype(DType::f16);
  EXPECT_TRUE(ints.astype(DType::i32)
                  .bitwise_equal(Tensor::from_vector<std::int32_t>(Shape{3}, {-3, 2, 255})));
  EXPECT_EQ(ints.astype(DType::u8).item(2), 255.0);
  EXPECT_TRUE(
      Tensor::from_vector<std::int64_t>(Shape{2}, {2049, -7})
          .astype(DType::f16)
          .bitwise_equal(Tensor::from_vector<double>(Shape{2}, {2048, -7}).astype(DType::f16)));
  // fill and item: the value rounded once.
  Tensor filled(Shape{3}, DType::f16);
  filled.fill(1 + 0x1p-11 + 0x1p-30);
  EXPECT_EQ(filled.item(2), 1 + 0x1p-10);
  EXPECT_EQ(describe(filled), "f16[3]");
}

}  // namespace test_tensor
}  // namespace meshtest

namespace meshtest {
namespace test_tensor {
TEST(Shape, OverflowingElementCountThrows) {
  EXPECT_THROW((Shape{1LL << 40, 1LL << 40}), Error);
  EXPECT_THROW((Shape{0, 1LL << 62, 1LL << 62}), Error);  // inner(0) would overflow
  EXPECT_NO_THROW((Shape{0, 1LL << 62}));
  EXPECT_EQ((Shape{1LL << 31, 1LL << 31}).numel(), 1LL << 62);
}
}  // namespace test_tensor
}  // namespace meshtest

namespace meshtest {
namespace test_tensor {

TEST(Tensor, ZeroFilledEvenOverReusedMemory) {
  // Freed memory is handed out again by malloc: the plain constructor must still zero it,
  // while Uninitialized gives the shape and size without a fill.
  for (int round = 0; round < 3; ++round) {
    {
      Tensor dirty(Shape{1024}, DType::f32, Tensor::Uninitialized{});
      EXPECT_EQ(dirty.nbytes(), 4096u);
      dirty.fill(7);
    }
    const Tensor t(Shape{1024}, DType::f32);
    EXPECT_TRUE(t.vector<float>().isZero(0)) << "round " << round;
  }
}

/// A MemoryResource that counts its live bytes (a stand-in for the node arena).
class CountingResource : public MemoryResource {
 public:
  void* allocate(std::size_t bytes) override {
    live += bytes;
    return ::operator new (bytes, std::align_val_t{64});
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    live -= bytes;
    ::operator delete (p, std::align_val_t{64});
  }
  std::size_t live = 0;
};

TEST(Tensor, AResourceHoldsItsBytesAndMovesKeepThem) {
  CountingResource r;
  {
    Tensor t(Shape{4, 3}, DType::f32, r);
    EXPECT_EQ(t.resource(), &r);
    EXPECT_EQ(r.live, 48U);
    EXPECT_EQ(t.item(5), 0.0) << "zero-filled";
    t.fill(2);
    const Tensor copy = t;  // a copy is an ordinary heap tensor
    EXPECT_EQ(copy.resource(), nullptr);
    EXPECT_TRUE(copy.bitwise_equal(t));
    EXPECT_EQ(t.slice(0, 1, 2).resource(), nullptr);
    Tensor moved = std::move(t);  // a move keeps the bytes where they are
    EXPECT_EQ(moved.resource(), &r);
    EXPECT_EQ(r.live, 48U);
    Tensor assigned(Shape{2}, DType::f32);
    assigned = std::move(moved);
    EXPECT_EQ(assigned.resource(), &r);
    EXPECT_EQ(assigned.item(11), 2.0);
    Tensor target(Shape{4, 3}, DType::f32, r);
    target = copy;  // copy-assigning keeps the target's resource
    EXPECT_EQ(target.resource(), &r);
    EXPECT_TRUE(target.bitwise_equal(copy));
    EXPECT_EQ(r.live, 96U);
  }
  EXPECT_EQ(r.live, 0U) << "every byte went back to the resource";
}

}  // namespace test_tensor
}  // namespace meshtest
