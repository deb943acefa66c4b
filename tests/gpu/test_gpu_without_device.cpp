// The GPU side where no device is visible (CTest runs this with CUDA_VISIBLE_DEVICES empty):
// device_count() is 0 with a reason, every call that needs a device is an Error naming the
// CUDA error, and the argument checks of reduce_terms come before any device is touched.
#include <gtest/gtest.h>

#include <cstdint>
#include <regex>
#include <utility>
#include <vector>

#include "src/gpu/device_tensor.hpp"
#include "src/gpu/reduce.hpp"
#include "src/gpu/runtime.hpp"
#include "tests/gpu/skip.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::gpu {
namespace {

using test_support::expect_error;

TEST(WithoutDevice, NoDeviceIsCountedAndTheReasonNamesTheRuntimesError) {
  EXPECT_EQ(device_count(), 0);
  const std::string why = no_gpu_reason();
  EXPECT_EQ(why.rfind("cudaGetDeviceCount: ", 0), 0u) << why;
  EXPECT_GT(why.size(), std::string("cudaGetDeviceCount: ").size()) << why;
  EXPECT_EQ(testing::skip_reason(1), "no GPU: " + why);
  EXPECT_EQ(testing::skip_reason(0), "");
}

TEST(WithoutDevice, SetDeviceNamesTheOrdinalAndTheCount) {
  expect_error([] { set_device(0); }, {"no CUDA device 0", "this process sees 0 devices"});
  expect_error([] { set_device(-1); }, {"no CUDA device -1"});
}

TEST(WithoutDevice, CudaCheckNamesTheErrorTheExpressionAndTheLine) {
  try {
    MESHTEST_CUDA_CHECK(cudaErrorInvalidValue);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::regex want(
        R"(CUDA error cudaErrorInvalidValue: .+ in `cudaErrorInvalidValue` \(.*test_gpu_without_device\.cpp:[0-9]+\))");
    EXPECT_TRUE(std::regex_match(e.what(), want)) << e.what();
  }
  EXPECT_NO_THROW(MESHTEST_CUDA_CHECK(cudaSuccess));
}

TEST(WithoutDevice, AllocatingIsAnErrorAndEmptyTensorsNeedNoDevice) {
  expect_error([] { DeviceTensor t({2, 3}, DType::f32); }, {"CUDA error"});
  expect_error([] { DeviceTensor::from_host(Tensor({4}, DType::i32)); }, {"CUDA error"});
  expect_error([] { Stream s; }, {"CUDA error"});
  const DeviceTensor empty({0, 3}, DType::bf16);
  EXPECT_EQ(empty.device(), -1);
  EXPECT_EQ(empty.bytes(), nullptr);
  EXPECT_EQ(describe(empty), "bf16[0, 3] (empty)");
  EXPECT_TRUE(empty.to_host().bitwise_equal(Tensor({0, 3}, DType::bf16)));
  EXPECT_EQ(split(empty, 2, 1).size(), 2u);
  const DeviceTensor none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(describe(none), "f32[0] (empty)");
  DeviceTensor copy = empty;
  EXPECT_EQ(describe(copy), "bf16[0, 3] (empty)");
  const DeviceTensor moved = std::move(copy);
  EXPECT_EQ(describe(moved), "bf16[0, 3] (empty)");
  EXPECT_EQ(describe(copy), "f32[0] (empty)");
}

TEST(WithoutDevice, ReduceTermsChecksItsArgumentsFirst) {
  // Never dereferenced: every check below fails before a kernel is queued.
  const auto* a = reinterpret_cast<const std::byte*>(std::uintptr_t{0x10000});
  const auto* b = reinterpret_cast<const std::byte*>(std::uintptr_t{0x20000});
  auto* dst = reinterpret_cast<std::byte*>(std::uintptr_t{0x30000});
  const std::vector<const std::byte*> two{a, b};
  expect_error([&] { reduce_terms(dst, two, 8, DType::u8, Reduce::sum, nullptr); },
               {"dtype u8 cannot be reduced"});
  expect_error([&] { reduce_terms(dst, two, 8, DType::i32, Reduce::avg, nullptr); },
               {"avg needs a floating dtype", "not i32"});
  expect_error([&] { reduce_terms(dst, {}, 8, DType::f32, Reduce::max, nullptr); }, {"no terms"});
  expect_error([&] { reduce_terms(dst, two, -1, DType::f32, Reduce::sum, nullptr); }, {"n = -1"});
  const std::vector<const std::byte*> with_null{a, nullptr};
  expect_error([&] { reduce_terms(dst, with_null, 8, DType::f32, Reduce::sum, nullptr); },
               {"term 1 is null"});
  const std::vector<const std::byte*> misaligned{a, b + 2};
  expect_error([&] { reduce_terms(dst, misaligned, 8, DType::f64, Reduce::min, nullptr); },
               {"term 1", "not aligned to its 8-byte f64 elements"});
  expect_error([&] { reduce_terms(nullptr, two, 8, DType::f32, Reduce::sum, nullptr); },
               {"dst is null"});
  EXPECT_NO_THROW(reduce_terms(dst, two, 0, DType::f32, Reduce::sum, nullptr));  // nothing to do
}

}  // namespace
}  // namespace meshtest::gpu
