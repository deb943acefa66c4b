// reduce_terms against a host reference written here from the CPU path's rule (axis order,
// bf16 and f16 in f32 rounded once, avg divided in the accumulator, wrapping integer sums,
// std::max/std::min), bit for bit: every dtype and operator at p = 1..9 and past one pass
// (p > 32), odd n, misaligned and mixed offsets, dst aliasing a term; crafted cases with
// closed-form results (single rounding, axis order, NaN, -0.0, wrap-around).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "src/core/random.hpp"
#include "src/gpu/device_tensor.hpp"
#include "src/gpu/reduce.hpp"
#include "src/gpu/runtime.hpp"

namespace meshtest::gpu {
namespace {

std::string_view op_name(Reduce op) {
  constexpr std::string_view names[] = {"sum", "max", "min", "avg"};
  return names[static_cast<int>(op)];
}

/// The type sums are taken in: integers wrap as their unsigned types do.
template <class T>
struct SumType {
  using type = T;
};
template <>
struct SumType<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct SumType<std::int64_t> {
  using type = std::uint64_t;
};

/// The CPU path's reduction of one element after another: terms combined in order in the
/// accumulator (f32 for bf16 and f16, the unsigned type for integer sums), one conversion at the
/// end.
Tensor reference(const std::vector<Tensor>& terms, Reduce op) {
  const Tensor& first = terms.front();
  Tensor out(first.shape(), first.dtype());
  visit_dtype(first.dtype(), [&]<class T>(type_tag<T>) {
    using Float = std::conditional_t<widens_to_f32(dtype_of<T>()), float, T>;
    using A = typename SumType<Float>::type;
    const auto p = static_cast<std::int64_t>(terms.size());
    for (std::int64_t k = 0; k < first.numel(); ++k) {
      Float acc = static_cast<Float>(first.data<T>()[k]);
      for (std::int64_t j = 1; j < p; ++j) {
        const auto x = static_cast<Float>(terms[static_cast<std::size_t>(j)].data<T>()[k]);
        if (op == Reduce::max) {
          acc = std::max(acc, x);
        } else if (op == Reduce::min) {
          acc = std::min(acc, x);
        } else {
          acc = static_cast<Float>(static_cast<A>(static_cast<A>(acc) + static_cast<A>(x)));
        }
      }
      if constexpr (std::is_floating_point_v<Float>) {
        if (op == Reduce::avg) acc = acc / static_cast<Float>(p);
      }
      out.data<T>()[k] = static_cast<T>(acc);
    }
  });
  return out;
}

/// Where the buffers of one reduction sit: each term j at offsets[j] elements into a buffer of
/// its own (0 for any j past the list), dst at dst_offset, or dst = term `alias`.
struct Layout {
  std::vector<std::int64_t> offsets = {};
  std::int64_t dst_offset = 0;
  int alias = -1;
};

/// reduce_terms on device copies of `terms` laid out as `layout`, on a stream of its own;
/// the result back on the host. Checks that nothing around dst was written.
Tensor reduce_on_device(const std::vector<Tensor>& terms, Reduce op, const Layout& layout = {}) {
  const DType t = terms.front().dtype();
  const std::int64_t n = terms.front().numel();
  const auto placed = [&](const Tensor& body, std::int64_t offset, std::uint8_t fill) {
    Tensor padded({offset + n + 5}, t);
    std::memset(padded.bytes(), fill, padded.nbytes());
    padded.assign_slice(0, offset, body.reshape({n}));
    return padded;
  };
  std::vector<DeviceTensor> buffers;
  std::vector<const std::byte*> pointers;
  std::vector<std::int64_t> offsets = {};
  for (std::size_t j = 0; j < terms.size(); ++j) {
    offsets.push_back(j < layout.offsets.size() ? layout.offsets[j] : 0);
    buffers.push_back(DeviceTensor::from_host(placed(terms[j], offsets.back(), 0x5a)));
  }
  for (std::size_t j = 0; j < terms.size(); ++j) {
    pointers.push_back(buffers[j].bytes() + offsets[j] * static_cast<std::int64_t>(dtype_size(t)));
  }
  const Tensor dst_fill = placed(Tensor(terms.front().shape(), t), layout.dst_offset, 0xa5);
  DeviceTensor dst_buffer = DeviceTensor::from_host(dst_fill);
  DeviceTensor& out =
      layout.alias >= 0 ? buffers[static_cast<std::size_t>(layout.alias)] : dst_buffer;
  const std::int64_t out_offset =
      layout.alias >= 0 ? offsets[static_cast<std::size_t>(layout.alias)] : layout.dst_offset;
  Stream stream;
  reduce_terms(out.bytes() + out_offset * static_cast<std::int64_t>(dtype_size(t)), pointers, n, t,
               op, stream.get());
  stream.synchronize();
  const Tensor all = out.to_host();
  const Tensor before =
      layout.alias >= 0 ? placed(terms[static_cast<std::size_t>(layout.alias)], out_offset, 0x5a)
                        : dst_fill;
  EXPECT_TRUE(all.slice(0, 0, out_offset).bitwise_equal(before.slice(0, 0, out_offset)))
      << "written before dst";
  EXPECT_TRUE(all.slice(0, out_offset + n, 5).bitwise_equal(before.slice(0, out_offset + n, 5)))
      << "written after dst";
  return all.slice(0, out_offset, n).reshape(terms.front().shape());
}

std::vector<Tensor> random_terms(DType t, int p, std::int64_t n, std::uint64_t seed) {
  std::vector<Tensor> terms;
  for (int j = 0; j < p; ++j) {
    const RandomKey key{.seed = seed, .stream = static_cast<std::uint64_t>(j)};
    if (t == DType::i32) {
      terms.push_back(random_integers({n}, t, key, std::numeric_limits<std::int32_t>::min(),
                                      std::numeric_limits<std::int32_t>::max()));
    } else if (t == DType::i64) {
      terms.push_back(
          random_integers({n}, t, key, -(std::int64_t{1} << 62), std::int64_t{1} << 62));
    } else {
      terms.push_back(random_normal({n}, t, key, 0.0, 1.0 + j));
    }
  }
  return terms;
}

std::vector<Reduce> ops_of(DType t) {
  if (is_floating(t)) return {Reduce::sum, Reduce::max, Reduce::min, Reduce::avg};
  return {Reduce::sum, Reduce::max, Reduce::min};
}

constexpr DType kReducible[] = {DType::f32, DType::f64, DType::bf16,
                                DType::f16, DType::i32, DType::i64};

TEST(ReduceTerms, EveryDTypeAndOpMatchesTheReferenceAtOneToNineTerms) {
  // aligned: every buffer at element 0; shifted: all at one odd offset (a vector head);
  // mixed: offsets that differ (one element at a time).
  const std::vector<std::pair<const char*, Layout>> layouts = {
      {"aligned", {}},
      {"shifted", {.offsets = std::vector<std::int64_t>(9, 3), .dst_offset = 3}},
      {"mixed", {.offsets = {0, 1, 2, 3, 4, 5, 6, 7, 8}, .dst_offset = 1}}};
  for (DType t : kReducible) {
    for (Reduce op : ops_of(t)) {
      for (int p = 1; p <= 9; ++p) {
        for (std::int64_t n : {1, 7, 1031}) {
          const auto terms = random_terms(t, p, n, 100 + p);
          const Tensor want = reference(terms, op);
          for (const auto& [name, layout] : layouts) {
            SCOPED_TRACE(fmt::format("{} {} p {} n {} {}", t, op_name(op), p, n, name));
            EXPECT_TRUE(reduce_on_device(terms, op, layout).bitwise_equal(want));
          }
        }
      }
    }
  }
}

TEST(ReduceTerms, ManyTermsTakeSeveralPassesWithTheSameBits) {
  for (DType t : kReducible) {
    for (Reduce op : ops_of(t)) {
      for (int p : {32, 33, 64, 65, 70}) {
        const auto terms = random_terms(t, p, 523, 200 + p);
        const Tensor want = reference(terms, op);
        SCOPED_TRACE(fmt::format("{} {} p {}", t, op_name(op), p));
        EXPECT_TRUE(reduce_on_device(terms, op).bitwise_equal(want));
        EXPECT_TRUE(reduce_on_device(terms, op,
                                     {.offsets = std::vector<std::int64_t>(p, 5), .dst_offset = 5})
                        .bitwise_equal(want));
        EXPECT_TRUE(reduce_on_device(terms, op, {.dst_offset = 1}).bitwise_equal(want));
      }
    }
  }
}

TEST(ReduceTerms, DstMayBeAnyTerm) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    for (int p : {1, 2, 5, 40}) {
      const auto terms = random_terms(t, p, 1001, 300 + p);
      const Tensor want = reference(terms, Reduce::sum);
      for (int alias : {0, p / 2, p - 1}) {
        SCOPED_TRACE(fmt::format("{} p {} dst = term {}", t, p, alias));
        EXPECT_TRUE(reduce_on_device(terms, Reduce::sum, {.alias = alias}).bitwise_equal(want));
        EXPECT_TRUE(reduce_on_device(terms, Reduce::sum,
                                     {.offsets = std::vector<std::int64_t>(p, 1), .alias = alias})
                        .bitwise_equal(want));
      }
    }
  }
}

TEST(ReduceTerms, LargeInputsLoopOverTheGrid) {
  const std::int64_t n = (std::int64_t{5} << 20) + 3;  // more elements than resident threads
  for (const auto& [t, op] :
       {std::pair{DType::f32, Reduce::sum}, std::pair{DType::bf16, Reduce::avg},
        std::pair{DType::f16, Reduce::sum}, std::pair{DType::i32, Reduce::max}}) {
    const auto terms = random_terms(t, 3, n, 400);
    SCOPED_TRACE(fmt::format("{} {}", t, op_name(op)));
    EXPECT_TRUE(reduce_on_device(terms, op).bitwise_equal(reference(terms, op)));
  }
}

/// Each case's terms (as bit patterns of T) reduced at every element of n = 37 (vector and
/// scalar code alike) must give `want`.
template <class T, class Bits>
void expect_bits(Reduce op, const std::vector<Bits>& term_bits, Bits want) {
  static_assert(sizeof(T) == sizeof(Bits));
  constexpr std::int64_t n = 37;
  std::vector<Tensor> terms;
  for (Bits b : term_bits) {
    Tensor term({n}, dtype_of<T>());
    for (std::int64_t k = 0; k < n; ++k) std::memcpy(term.bytes() + k * sizeof(T), &b, sizeof(T));
    terms.push_back(term);
  }
  const Tensor got = reduce_on_device(terms, op);
  for (std::int64_t k = 0; k < n; ++k) {
    Bits b;
    std::memcpy(&b, got.bytes() + k * sizeof(T), sizeof(T));
    EXPECT_EQ(b, want) << fmt::format("{} {} of {:#x} at {}: got {:#x}", dtype_of<T>(), op_name(op),
                                      fmt::join(term_bits, ", "), k, b);
  }
  // The reference keeps the same rule (so the random tests above check it too).
  Bits r;
  std::memcpy(&r, reference(terms, op).bytes(), sizeof(T));
  EXPECT_EQ(r, want) << "reference";
}

/// The bits of a 2-byte float T (bf16, f16) that show one rounding after all terms: 1 + h + h
/// with h half of 1's ulp is 1 + ulp exactly, where a rounding after each addition would keep 1
/// (ties to even); its avg over the three terms rounds that sum / 3 once; 1 plus 64 quarter ulps
/// q over three passes.
struct OnceBits {
  std::uint16_t one, h, sum, avg, q, many;
};
template <class T>
void expect_rounded_once(const OnceBits& b) {
  expect_bits<T, std::uint16_t>(Reduce::sum, {b.one, b.h, b.h}, b.sum);
  expect_bits<T, std::uint16_t>(Reduce::avg, {b.one, b.h, b.h}, b.avg);
  std::vector<std::uint16_t> many{b.one};
  many.insert(many.end(), 64, b.q);
  expect_bits<T, std::uint16_t>(Reduce::sum, many, b.many);
}

TEST(ReduceTerms, Bf16RoundsOnceAfterAllTerms) {
  // h = 2^-8: the sum 1 + 2^-7; avg 43/128 exactly (0x3eac), from a rounded sum 1/3 (0x3eab);
  // q = 2^-9: 1.125.
  expect_rounded_once<bf16>(
      {.one = 0x3f80, .h = 0x3b80, .sum = 0x3f81, .avg = 0x3eac, .q = 0x3b00, .many = 0x3f90});
}

TEST(ReduceTerms, F16RoundsOnceAfterAllTerms) {
  // h = 2^-11: the sum 1 + 2^-10; avg 1367/4096 (0x3557), from a rounded sum 1365/4096
  // (0x3555); q = 2^-12: 1 + 2^-6.
  expect_rounded_once<f16>(
      {.one = 0x3c00, .h = 0x1000, .sum = 0x3c01, .avg = 0x3557, .q = 0x0c00, .many = 0x3c10});
  // Subnormals and the edge of the range: 2^-13 + two least subnormals (each a tie alone);
  // 65504 + 8 + 8 reaches the tie 65520, which rounds to Inf.
  expect_bits<f16, std::uint16_t>(Reduce::sum, {0x0800, 0x0001, 0x0001}, 0x0801);
  expect_bits<f16, std::uint16_t>(Reduce::sum, {0x7bff, 0x4800, 0x4800}, 0x7c00);
  expect_bits<f16, std::uint16_t>(Reduce::sum, {0x7bff, 0x4800}, 0x7bff);
}

TEST(ReduceTerms, TermsAreAddedInAxisOrder) {
  const auto f = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  // (((2^24 + 1) + 1) - 2^24) = 0 in f32; any other grouping of these four gives 2.
  expect_bits<float, std::uint32_t>(Reduce::sum,
                                    {f(16777216.0f), f(1.0f), f(1.0f), f(-16777216.0f)}, f(0.0f));
  std::vector<std::uint32_t> many{f(16777216.0f)};
  many.insert(many.end(), 38, f(1.0f));
  many.push_back(f(-16777216.0f));
  expect_bits<float, std::uint32_t>(Reduce::sum, many, f(0.0f));
}

TEST(ReduceTerms, NaNAndSignedZeroAsOnTheCpuPath) {
  const std::uint32_t one = 0x3f800000, qnan = 0x7fc00001, snan = 0x7f800005, neg_qnan = 0xffc00002,
                      inf = 0x7f800000, neg_inf = 0xff800000, zero = 0, neg_zero = 0x80000000;
  using F = float;
  using B = std::uint32_t;
  expect_bits<F, B>(Reduce::sum, {one, qnan}, qnan);  // the NaN operand, payload kept
  expect_bits<F, B>(Reduce::sum, {qnan, one}, qnan);
  expect_bits<F, B>(Reduce::sum, {one, snan}, 0x7fc00005);     // made quiet
  expect_bits<F, B>(Reduce::sum, {neg_qnan, one}, neg_qnan);   // sign kept
  expect_bits<F, B>(Reduce::sum, {inf, neg_inf}, 0xffc00000);  // the default NaN
  expect_bits<F, B>(Reduce::sum, {inf, neg_inf, one}, 0xffc00000);
  expect_bits<F, B>(Reduce::avg, {qnan, one}, qnan);
  expect_bits<F, B>(Reduce::avg, {snan, one}, 0x7fc00005);
  expect_bits<F, B>(Reduce::max, {one, qnan}, one);   // a NaN term is skipped
  expect_bits<F, B>(Reduce::max, {qnan, one}, qnan);  // a NaN accumulator stays
  expect_bits<F, B>(Reduce::max, {snan, one}, snan);  // as it is: no arithmetic
  expect_bits<F, B>(Reduce::min, {one, qnan}, one);
  expect_bits<F, B>(Reduce::min, {qnan, one}, qnan);
  expect_bits<F, B>(Reduce::max, {neg_zero, zero}, neg_zero);  // ties keep the earlier term
  expect_bits<F, B>(Reduce::max, {zero, neg_zero}, zero);
  expect_bits<F, B>(Reduce::min, {neg_zero, zero}, neg_zero);
  expect_bits<F, B>(Reduce::min, {zero, neg_zero}, zero);
  expect_bits<F, B>(Reduce::sum, {neg_zero, neg_zero}, neg_zero);
  expect_bits<F, B>(Reduce::sum, {neg_zero, zero}, zero);

  using H = std::uint16_t;  // bf16: every NaN stored as 0x7fc0 or 0xffc0 by its sign
  expect_bits<bf16, H>(Reduce::sum, {0x3f80, 0x7fc1}, 0x7fc0);
  expect_bits<bf16, H>(Reduce::sum, {0x3f80, 0xffc3}, 0xffc0);
  expect_bits<bf16, H>(Reduce::sum, {0x7f80, 0xff80}, 0xffc0);
  expect_bits<bf16, H>(Reduce::max, {0x7f81, 0x3f80}, 0x7fc0);
  expect_bits<bf16, H>(Reduce::max, {0x3f80, 0x7f81}, 0x3f80);
  expect_bits<bf16, H>(Reduce::avg, {0xffc3, 0x3f80}, 0xffc0);
  expect_bits<bf16, H>(Reduce::min, {0x8000, 0x0000}, 0x8000);

  // f16: a NaN stays one of its sign, quiet, with the top bits of its payload (f16_bits.hpp).
  expect_bits<f16, H>(Reduce::sum, {0x3c00, 0x7e01}, 0x7e01);
  expect_bits<f16, H>(Reduce::sum, {0x3c00, 0xfe03}, 0xfe03);
  expect_bits<f16, H>(Reduce::sum, {0x7c01, 0x3c00}, 0x7e01);  // a signalling NaN made quiet
  expect_bits<f16, H>(Reduce::sum, {0x7c00, 0xfc00}, 0xfe00);  // the default NaN
  expect_bits<f16, H>(Reduce::max, {0x7c01, 0x3c00}, 0x7e01);
  expect_bits<f16, H>(Reduce::max, {0x3c00, 0x7c01}, 0x3c00);
  expect_bits<f16, H>(Reduce::avg, {0xfe03, 0x3c00}, 0xfe03);
  expect_bits<f16, H>(Reduce::min, {0x8000, 0x0000}, 0x8000);
  expect_bits<f16, H>(Reduce::sum, {0x7c00, 0x3c00}, 0x7c00);

  using D = std::uint64_t;
  const D dqnan = 0x7ff8000000000001, dinf = 0x7ff0000000000000, dneg_inf = 0xfff0000000000000,
          done = 0x3ff0000000000000;
  expect_bits<double, D>(Reduce::sum, {done, dqnan}, dqnan);
  expect_bits<double, D>(Reduce::sum, {dinf, dneg_inf}, 0xfff8000000000000);
  expect_bits<double, D>(Reduce::avg, {dqnan, done}, dqnan);
  expect_bits<double, D>(Reduce::max, {0x8000000000000000, 0}, 0x8000000000000000);
}

TEST(ReduceTerms, IntegerSumsWrap) {
  using I = std::int32_t;
  constexpr I imax = std::numeric_limits<I>::max(), imin = std::numeric_limits<I>::min();
  expect_bits<I, I>(Reduce::sum, {imax, 1}, imin);
  expect_bits<I, I>(Reduce::sum, {imin, -1}, imax);
  expect_bits<I, I>(Reduce::max, {-1, imin, 7}, 7);
  using L = std::int64_t;
  constexpr L lmax = std::numeric_limits<L>::max(), lmin = std::numeric_limits<L>::min();
  expect_bits<L, L>(Reduce::sum, {lmax, 1}, lmin);
  expect_bits<L, L>(Reduce::sum, {lmax, lmax, 2}, 0);
  expect_bits<L, L>(Reduce::min, {lmax, -1, lmin}, lmin);
}

TEST(ReduceTerms, RunsOnTheLegacyDefaultStreamToo) {
  const auto terms = random_terms(DType::f32, 4, 999, 500);
  std::vector<DeviceTensor> dev;
  std::vector<const std::byte*> pointers;
  for (const Tensor& t : terms) dev.push_back(DeviceTensor::from_host(t));
  for (const DeviceTensor& d : dev) pointers.push_back(d.bytes());
  DeviceTensor out({999}, DType::f32);
  reduce_terms(out.bytes(), pointers, 999, DType::f32, Reduce::sum, nullptr);
  MESHTEST_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  EXPECT_TRUE(out.to_host().bitwise_equal(reference(terms, Reduce::sum)));
}

// Informational: the reduction's speed on this GPU (no threshold: it depends on the card).
TEST(ReduceTerms, PrintsItsBandwidth) {
  const std::int64_t n = std::int64_t{64} << 20;  // 256 MiB of f32 per term
  for (int p : {2, 4}) {
    std::vector<DeviceTensor> dev;
    std::vector<const std::byte*> pointers;
    for (int j = 0; j < p; ++j) {
      dev.emplace_back(Shape{n}, DType::f32);
      pointers.push_back(dev.back().bytes());
    }
    DeviceTensor out({n}, DType::f32, Tensor::Uninitialized{});
    Stream s;
    Event start, end;
    reduce_terms(out.bytes(), pointers, n, DType::f32, Reduce::sum, s.get());  // warm-up
    constexpr int kIterations = 10;
    start.record(s.get());
    for (int i = 0; i < kIterations; ++i) {
      reduce_terms(out.bytes(), pointers, n, DType::f32, Reduce::sum, s.get());
    }
    end.record(s.get());
    end.synchronize();
    const double ms = end.elapsed_ms_since(start) / kIterations;
    const double bytes = static_cast<double>(p + 1) * static_cast<double>(n) * 4;
    std::printf("[ reduce   ] f32 sum, p %d, %lld elements: %.3f ms, %.1f GB/s (read + write)\n", p,
                static_cast<long long>(n), ms, bytes / ms / 1e6);
  }
}

}  // namespace
}  // namespace meshtest::gpu
