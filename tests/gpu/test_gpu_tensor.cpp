// DeviceTensor against the host Tensor: copies bit for bit in every dtype, the same slice,
// assign_slice, split, concat and reshape results, copy and move semantics, devices, streams
// and events, and the bad inputs (dtype, ranges, devices, an allocation no GPU has).
#include <gtest/gtest.h>

#include <memory>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "src/core/random.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/runtime.hpp"
#include "tests/support/expect_error.hpp"

namespace meshtest::gpu {
namespace {

using test_support::expect_error;

/// Arbitrary bytes (Philox words), NaN and denormal patterns included: a copy must keep them.
Tensor pattern(Shape shape, DType t, std::uint64_t seed) {
  Tensor out(shape, t);
  for (std::size_t i = 0; i < out.nbytes(); i += 4) {
    const auto word = random_bits_at({.seed = seed, .stream = 28}, i / 4)[0];
    std::memcpy(out.bytes() + i, &word, std::min<std::size_t>(4, out.nbytes() - i));
  }
  return out;
}

const std::vector<Shape> kShapes = {
    {}, {1}, {7}, {3, 5}, {4, 1, 6}, {2, 3, 0, 5}, {2, 1, 3, 1, 2, 3}};

TEST(DeviceTensor, HostRoundTripIsBitExactInEveryDType) {
  for (DType t : kAllDTypes) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(fmt::format("{}{}", t, shape));
      const Tensor host = pattern(shape, t, 1);
      const DeviceTensor dev = DeviceTensor::from_host(host);
      EXPECT_EQ(dev.shape(), shape);
      EXPECT_EQ(dev.dtype(), t);
      EXPECT_EQ(dev.nbytes(), host.nbytes());
      EXPECT_EQ(dev.numel(), host.numel());
      EXPECT_EQ(dev.rank(), host.rank());
      EXPECT_EQ(dev.empty(), host.empty());
      EXPECT_EQ(dev.device(), host.empty() ? -1 : current_device());
      EXPECT_TRUE(dev.to_host().bitwise_equal(host));
    }
  }
}

TEST(DeviceTensor, NewTensorsAreZeroFilled) {
  for (DType t : kAllDTypes) {
    const DeviceTensor dev({5, 33}, t);
    EXPECT_TRUE(dev.to_host().bitwise_equal(Tensor({5, 33}, t))) << dtype_name(t);
    const DeviceTensor raw({5, 33}, t, Tensor::Uninitialized{});
    EXPECT_EQ(raw.nbytes(), 5 * 33 * dtype_size(t));
  }
}

TEST(DeviceTensor, SliceMatchesTheHostsEveryDimAndRange) {
  const Tensor host = pattern({4, 5, 6}, DType::bf16, 2);
  const DeviceTensor dev = DeviceTensor::from_host(host);
  for (int dim = -3; dim < 3; ++dim) {
    const std::int64_t n = host.shape()[dim < 0 ? dim + 3 : dim];
    for (std::int64_t start = 0; start <= n; ++start) {
      for (std::int64_t size = 0; start + size <= n; ++size) {
        SCOPED_TRACE(fmt::format("dim {} [{}, {})", dim, start, start + size));
        const DeviceTensor part = dev.slice(dim, start, size);
        EXPECT_TRUE(part.to_host().bitwise_equal(host.slice(dim, start, size)));
        EXPECT_EQ(part.device(), part.empty() ? -1 : dev.device());
      }
    }
  }
}

TEST(DeviceTensor, AssignSliceMatchesTheHosts) {
  for (int dim = 0; dim < 3; ++dim) {
    Tensor host = pattern({3, 4, 5}, DType::f64, 3);
    DeviceTensor dev = DeviceTensor::from_host(host);
    const Tensor src = pattern(host.shape().with(dim, 2), DType::f64, 4);
    host.assign_slice(dim, 1, src);
    dev.assign_slice(dim, 1, DeviceTensor::from_host(src));
    EXPECT_TRUE(dev.to_host().bitwise_equal(host)) << "dim " << dim;
    dev.assign_slice(dim, 0, DeviceTensor(host.shape().with(dim, 0), DType::f64));  // no-op
    EXPECT_TRUE(dev.to_host().bitwise_equal(host)) << "dim " << dim;
  }
}

TEST(DeviceTensor, SplitAndConcatMatchTheHosts) {
  const Tensor host = pattern({7, 3, 5}, DType::i32, 5);
  const DeviceTensor dev = DeviceTensor::from_host(host);
  for (int dim = 0; dim < 3; ++dim) {
    for (int p = 1; p <= 9; ++p) {  // p > n gives empty parts, as array_split does
      SCOPED_TRACE(fmt::format("dim {} p {}", dim, p));
      const std::vector<Tensor> want = split(host, p, dim);
      const std::vector<DeviceTensor> parts = split(dev, p, dim);
      ASSERT_EQ(parts.size(), want.size());
      for (std::size_t i = 0; i < parts.size(); ++i) {
        EXPECT_TRUE(parts[i].to_host().bitwise_equal(want[i])) << "part " << i;
      }
      EXPECT_TRUE(concat(parts, dim).to_host().bitwise_equal(host));
    }
  }
  const std::vector<Tensor> host_parts{pattern({2, 3}, DType::u8, 6), pattern({2, 1}, DType::u8, 7),
                                       pattern({2, 4}, DType::u8, 8)};
  std::vector<DeviceTensor> dev_parts;
  for (const Tensor& t : host_parts) dev_parts.push_back(DeviceTensor::from_host(t));
  EXPECT_TRUE(concat(dev_parts, -1).to_host().bitwise_equal(concat(host_parts, -1)));
}

TEST(DeviceTensor, ReshapeKeepsTheBytes) {
  const Tensor host = pattern({4, 6}, DType::f32, 9);
  const DeviceTensor dev = DeviceTensor::from_host(host);
  const DeviceTensor r = dev.reshape({2, 3, 4});
  EXPECT_EQ(r.shape(), Shape({2, 3, 4}));
  EXPECT_TRUE(r.to_host().bitwise_equal(host.reshape({2, 3, 4})));
  expect_error([&] { (void)dev.reshape({5, 5}); }, {"reshape", "24 elements", "25"});
}

TEST(DeviceTensor, BitwiseEqualComparesDTypeShapeAndEveryByte) {
  const Tensor host = pattern({3, 7}, DType::bf16, 10);
  const DeviceTensor a = DeviceTensor::from_host(host);
  EXPECT_TRUE(a.bitwise_equal(DeviceTensor::from_host(host)));
  Tensor changed = host;
  changed.bytes()[changed.nbytes() - 1] ^= std::byte{1};  // the last byte only
  EXPECT_FALSE(a.bitwise_equal(DeviceTensor::from_host(changed)));
  EXPECT_FALSE(a.bitwise_equal(a.reshape({7, 3})));
  EXPECT_FALSE(a.bitwise_equal(
      DeviceTensor::from_host(Tensor::from_bytes({3, 7}, DType::u8, std::span(host.bytes(), 21)))));
  EXPECT_TRUE(DeviceTensor({0}, DType::f32).bitwise_equal(DeviceTensor({0}, DType::f32)));
}

TEST(DeviceTensor, CopiesAreDeepAndMovesTakeTheStorage) {
  const Tensor host = pattern({4, 4}, DType::i64, 11);
  DeviceTensor a = DeviceTensor::from_host(host);
  DeviceTensor b = a;
  EXPECT_NE(b.bytes(), a.bytes());
  b.assign_slice(0, 0, DeviceTensor({1, 4}, DType::i64));
  EXPECT_TRUE(a.to_host().bitwise_equal(host));
  EXPECT_FALSE(b.to_host().bitwise_equal(host));

  DeviceTensor c;
  c = a;
  EXPECT_TRUE(c.to_host().bitwise_equal(host));
  c = c;  // self-assignment keeps the contents
  EXPECT_TRUE(c.to_host().bitwise_equal(host));

  const std::byte* storage = a.bytes();
  DeviceTensor d = std::move(a);
  EXPECT_EQ(d.bytes(), storage);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.shape(), Shape({0}));
  EXPECT_EQ(a.bytes(), nullptr);
  EXPECT_EQ(a.device(), -1);
  c = std::move(d);
  EXPECT_EQ(c.bytes(), storage);
  EXPECT_TRUE(c.to_host().bitwise_equal(host));
}

TEST(DeviceTensor, TypedPointersCheckTheDType) {
  DeviceTensor t({3}, DType::i32);
  EXPECT_EQ(reinterpret_cast<std::byte*>(t.data<std::int32_t>()), t.bytes());
  expect_error([&] { (void)t.data<float>(); },
               {"i32[3] on cuda:", "accessed as f32", "its dtype is i32"});
  const DeviceTensor& ct = t;
  expect_error([&] { (void)ct.data<bf16>(); }, {"accessed as bf16"});
  EXPECT_EQ(describe(t), fmt::format("i32[3] on cuda:{}", current_device()));
}

TEST(DeviceTensor, BadRangesShapesAndDTypesAreErrors) {
  DeviceTensor t({4, 5}, DType::f32);
  expect_error([&] { (void)t.slice(1, 3, 3); },
               {"slice [3, 6) out of range along dim 1 of size 5"});
  expect_error([&] { (void)t.slice(0, -1, 1); }, {"out of range along dim 0"});
  expect_error([&] { (void)t.slice(2, 0, 1); }, {"dim"});
  expect_error(
      [&] {
        t.assign_slice(0, 0, DeviceTensor({1, 5}, DType::f64));
      },
      {"dtype f64 into a tensor of dtype f32"});
  expect_error(
      [&] {
        t.assign_slice(0, 0, DeviceTensor({1, 4}, DType::f32));
      },
      {"shape [1, 4] does not fit [4, 5] along dim 0"});
  expect_error(
      [&] {
        t.assign_slice(0, 3, DeviceTensor({2, 5}, DType::f32));
      },
      {"[3, 5) out of range along dim 0 of size 4"});
  expect_error([] { (void)concat({}, 0); }, {"no tensors"});
  expect_error(
      [&] {
        (void)concat({t, DeviceTensor({4, 5}, DType::i32)}, 0);
      },
      {"dtypes differ (f32 and i32)"});
  expect_error(
      [&] {
        (void)concat({t, DeviceTensor({3, 4}, DType::f32)}, 0);
      },
      {"differ in another dim"});
  EXPECT_TRUE(split(t, 0, 0).empty());  // as the host's split
  expect_error([&] { (void)split(t, -1, 0); }, {"split: -1 parts asked of f32[4, 5] along dim 0"});
}

TEST(DeviceTensor, AnAllocationNoDeviceHoldsNamesTheBytes) {
  // 2^58 f32 elements: 2^60 bytes.
  expect_error([] { DeviceTensor t({std::int64_t{1} << 58}, DType::f32); },
               {"cudaMalloc of 1152921504606846976 bytes", "f32[288230376151711744]",
                fmt::format("on cuda:{}", current_device()), "bytes free"});
  // The device is still usable afterwards.
  EXPECT_TRUE(DeviceTensor::from_host(pattern({3}, DType::f32, 12))
                  .to_host()
                  .bitwise_equal(pattern({3}, DType::f32, 12)));
}

TEST(DeviceTensor, StreamOrderedStorageIsReusedInItsStreamsOrder) {
  // Made and freed in a stream's order: what the stream wrote is there after it finishes, a
  // block freed on the stream serves the next allocation there, and the tensor keeps the stream
  // alive once its maker lets go.
  auto stream = std::make_shared<Stream>();
  {
    DeviceTensor t({1000, 3}, DType::f32, StreamOrdered{stream});
    MESHTEST_CUDA_CHECK(cudaMemsetAsync(t.bytes(), 0x3f, t.nbytes(), stream->get()));
    stream->synchronize();
    const Tensor host = t.to_host();
    EXPECT_EQ(std::to_integer<int>(host.bytes()[0]), 0x3f);
    EXPECT_EQ(std::to_integer<int>(host.bytes()[host.nbytes() - 1]), 0x3f);
  }
  DeviceTensor again({1000, 3}, DType::f32, StreamOrdered{stream});
  MESHTEST_CUDA_CHECK(cudaMemsetAsync(again.bytes(), 0, again.nbytes(), stream->get()));
  stream->synchronize();
  EXPECT_TRUE(again.to_host().bitwise_equal(Tensor({1000, 3}, DType::f32)));
  const std::weak_ptr<Stream> alive = stream;
  stream.reset();
  EXPECT_FALSE(alive.expired()) << "the tensor must keep its stream";
  again = DeviceTensor();
  EXPECT_TRUE(alive.expired());
  expect_error([] { DeviceTensor t({2}, DType::f32, StreamOrdered{}); },
               {"StreamOrdered without a stream"});
}

TEST(DeviceTensor, AFreedBlockServesTheNextTensorOfAboutItsSize) {
  // 4 000 000 and 4 004 000 bytes round up to the same block (31 granules of 128 KiB): the
  // second tensor gets the first one's storage, and a zero-filled tensor made on a reused block
  // is zero-filled all the same.
  const std::byte* first = nullptr;
  {
    DeviceTensor a({1000, 1000}, DType::f32, Tensor::Uninitialized{});
    MESHTEST_CUDA_CHECK(cudaMemset(a.bytes(), 0x5a, a.nbytes()));
    first = a.bytes();
  }
  const DeviceTensor b({1000, 1001}, DType::f32);
  EXPECT_EQ(b.bytes(), first);
  EXPECT_TRUE(b.to_host().bitwise_equal(Tensor({1000, 1001}, DType::f32)));
  // Another size class gets other storage; a copy of a tensor on a reused block is deep.
  const DeviceTensor c({3000, 1000}, DType::f32, Tensor::Uninitialized{});
  EXPECT_NE(c.bytes(), first);
  const DeviceTensor d = DeviceTensor::from_host(pattern({1000, 1001}, DType::f32, 13));
  const DeviceTensor e = d;
  EXPECT_NE(e.bytes(), d.bytes());
  EXPECT_TRUE(e.to_host().bitwise_equal(pattern({1000, 1001}, DType::f32, 13)));
}

TEST(DeviceTensor, MemoryInUseAndItsPeakCountTheLiveTensors) {
  const int device = current_device();
  const std::size_t before = memory_in_use(device);
  reset_peak_memory(device);
  EXPECT_EQ(peak_memory(device), before);
  {
    const DeviceTensor a({1000, 1000}, DType::f32);  // 4 MB: its block at least that
    const std::size_t with_a = memory_in_use(device);
    EXPECT_GE(with_a - before, std::size_t{4000000});
    EXPECT_LT(with_a - before, std::size_t{5000000});  // blocks round up by an eighth at most
    {
      const DeviceTensor b({500, 1000}, DType::f32);
      EXPECT_GE(memory_in_use(device) - with_a, std::size_t{2000000});
    }
    EXPECT_EQ(memory_in_use(device), with_a);  // b's block back
    EXPECT_GE(peak_memory(device) - before, std::size_t{6000000});
    reset_peak_memory(device);
    EXPECT_EQ(peak_memory(device), with_a);
  }
  EXPECT_EQ(memory_in_use(device), before);
}

TEST(Runtime, SetDeviceOutOfRangeNamesTheOrdinalAndTheCount) {
  const int n = device_count();
  ASSERT_GT(n, 0);
  expect_error([&] { set_device(n); }, {fmt::format("no CUDA device {}", n),
                                        fmt::format("this process sees {} device", n)});
  expect_error([] { set_device(-1); }, {"no CUDA device -1"});
  EXPECT_EQ(no_gpu_reason(), "");
  set_device(0);
  EXPECT_EQ(current_device(), 0);
}

TEST(Runtime, StreamsAndEventsOrderAndTimeWork) {
  Stream s;
  EXPECT_EQ(s.device(), current_device());
  Event start, end;
  DeviceTensor t({1 << 20}, DType::f32);
  start.record(s.get());
  MESHTEST_CUDA_CHECK(cudaMemsetAsync(t.bytes(), 0xff, t.nbytes(), s.get()));
  end.record(s.get());
  end.synchronize();
  EXPECT_GE(end.elapsed_ms_since(start), 0.0f);
  s.synchronize();
  const Tensor host = t.to_host();
  EXPECT_EQ(std::to_integer<int>(host.bytes()[host.nbytes() - 1]), 0xff);
  Stream moved = std::move(s);
  EXPECT_EQ(s.get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
  moved.synchronize();
}

TEST(DeviceTensor, TensorsOnTwoDevicesStayApart) {
  if (device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << device_count();
  const Tensor host = pattern({4, 6}, DType::f32, 13);
  set_device(1);
  const DeviceTensor on1 = DeviceTensor::from_host(host);
  set_device(0);
  EXPECT_EQ(on1.device(), 1);
  EXPECT_TRUE(on1.to_host().bitwise_equal(host));
  const DeviceTensor part = on1.slice(1, 2, 3);  // made on the source's device
  EXPECT_EQ(part.device(), 1);
  EXPECT_TRUE(part.to_host().bitwise_equal(host.slice(1, 2, 3)));
  const DeviceTensor copy = on1;
  EXPECT_EQ(copy.device(), 1);
  EXPECT_EQ(current_device(), 0);  // each operation restores the current device
  DeviceTensor on0({4, 6}, DType::f32);
  EXPECT_TRUE(on0.bitwise_equal(DeviceTensor({4, 6}, DType::f32)));
  EXPECT_TRUE(on1.bitwise_equal(DeviceTensor::from_host(host)));  // compared on the host
  expect_error([&] { on0.assign_slice(1, 0, part); }, {"two devices", "on cuda:1", "on cuda:0"});
  expect_error([&] { (void)concat({on0, on1}, 0); }, {"parts on two devices", "cuda:0", "cuda:1"});
}

}  // namespace
}  // namespace meshtest::gpu
