// The table of collective cases: each CCL's input maker, exact expected output and run.
#include "dist/ccl/cases.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "dist/ccl/ccl.hpp"

namespace meshtest::dist {
namespace {

/// The values repeat with period 17 in the element index and in the device id.
constexpr int kPeriod = 17;
/// Subtracted from every value but u8's: the values are then -8 .. 8.
constexpr int kOffset = 8;

/// Element k's residue r = (11 k + 5) mod 17: the value of device d at k depends on d and r.
int residue(std::int64_t k) { return static_cast<int>((11 * (k % kPeriod) + 5) % kPeriod); }

/// Device d's value at residue r, before the dtype's offset.
int raw_value(int d, int r) { return static_cast<int>((37 * (d % kPeriod) + r) % kPeriod); }

/// A table of kPeriod values in dtype t, indexed by residue: element k of a tensor made from it
/// holds lut[residue(k)]. From f64 like Tensor::astype (bf16 and f16 through f32: one rounding
/// of the f32 value, as every CCL path rounds its f32 accumulator).
Tensor make_lut(const std::array<double, kPeriod>& v, DType t) {
  const Tensor f = Tensor::from_vector(Shape{kPeriod}, std::vector<double>(v.begin(), v.end()));
  return widens_to_f32(t) ? f.astype(DType::f32).astype(t) : f.astype(t);
}

/// Device d's input values by residue.
Tensor input_lut(int d, DType t) {
  std::array<double, kPeriod> v{};
  const int offset = t == DType::u8 ? 0 : kOffset;
  for (int r = 0; r < kPeriod; ++r) v[static_cast<std::size_t>(r)] = raw_value(d, r) - offset;
  return make_lut(v, t);
}

/// The reduction over c's devices (in axis order) of their inputs, by residue: the sum in f64
/// (exact for these integers), avg divided once, then rounded to the dtype as every path does.
Tensor reduced_lut(const CclCall& c) {
  MESHTEST_CHECK(c.dtype != DType::u8 && (c.reduce != ReduceOp::avg || is_floating(c.dtype)),
                 "{}: reduce op {} is not supported for dtype {}", ccl_case(c.op).name,
                 reduce_op_name(c.reduce), c.dtype);
  std::array<double, kPeriod> v{};
  for (int r = 0; r < kPeriod; ++r) {
    double acc = 0;
    for (std::size_t j = 0; j < c.devices.size(); ++j) {
      const double x = raw_value(c.devices[j], r) - kOffset;
      acc = j == 0                      ? x
            : c.reduce == ReduceOp::max ? std::max(acc, x)
            : c.reduce == ReduceOp::min ? std::min(acc, x)
                                        : acc + x;
    }
    if (c.reduce == ReduceOp::avg) acc /= static_cast<double>(c.devices.size());
    v[static_cast<std::size_t>(r)] = acc;
  }
  return make_lut(v, c.dtype);
}

/// Slice r along `dim` of a tensor of `whole` shape whose element k (its row-major index in
/// `whole`) is lut[residue(k)]. One pass; the residue steps by 11 mod 17.
Tensor fill(const Shape& whole, int dim, Range r, const Tensor& lut) {
  // Plain variables, not a structured binding: clang 14 cannot capture one in the lambda below.
  const std::int64_t start = r.start, size = r.size;
  const bool flat = whole.rank() == 0;  // a scalar: one element, index 0
  const int d = flat ? 0 : whole.normalize_dim(dim);
  const std::int64_t outer = flat ? 1 : whole.outer(d), inner = flat ? 1 : whole.inner(d);
  const std::int64_t n = flat ? 1 : whole[d];
  MESHTEST_CHECK(start >= 0 && size >= 0 && start + size <= n,
                 "case input: slice [{}, {}) outside dim {} of {}", start, start + size, d, whole);
  Tensor out(flat ? whole : whole.with(d, size), lut.dtype(), Tensor::Uninitialized{});
  visit_dtype(lut.dtype(), [&]<class T>(type_tag<T>) {
    const T* v = lut.data<T>();
    T* o = out.data<T>();
    for (std::int64_t a = 0; a < outer; ++a) {
      int k = residue((a * n + start) * inner);
      for (std::int64_t e = 0; e < size * inner; ++e) {
        *o++ = v[k];
        k += 11;
        if (k >= kPeriod) k -= kPeriod;
      }
    }
  });
  return out;
}

/// The whole tensor of `shape` made from lut.
Tensor fill_all(const Shape& shape, const Tensor& lut) {
  return fill(shape, 0, {.start = 0, .size = shape.rank() == 0 ? 1 : shape[0]}, lut);
}

void check_call(const CclCall& c) {
  const std::string_view name = ccl_case(c.op).name;
  const auto p = static_cast<std::size_t>(c.p());
  MESHTEST_CHECK(p > 0, "{} case: no devices", name);
  MESHTEST_CHECK(c.sizes.empty() || c.sizes.size() == p,
                 "{} case: {} sizes for {} devices (one each, or none)", name, c.sizes.size(), p);
  MESHTEST_CHECK(c.op != CclOp::all_to_all_v || c.counts.size() == p * p,
                 "all_to_all_v case: {} counts for {} devices (p x p)", c.counts.size(), p);
  MESHTEST_CHECK(std::ranges::all_of(c.sizes, [](std::int64_t n) { return n >= 0; }) &&
                     std::ranges::all_of(c.counts, [](std::int64_t n) { return n >= 0; }),
                 "{} case: negative size or count", name);
  MESHTEST_CHECK(c.op != CclOp::broadcast || (c.root >= 0 && c.root < c.p()),
                 "broadcast case: root {} outside [0, {})", c.root, p);
}

/// Device j's size along dim.
std::int64_t size_along_dim(const CclCall& c, int j) {
  if (c.op == CclOp::all_to_all_v) {
    const auto row = c.counts.begin() + static_cast<std::ptrdiff_t>(j) * c.p();
    return std::accumulate(row, row + c.p(), std::int64_t{0});
  }
  return c.sizes.empty() ? c.shape[c.shape.normalize_dim(c.dim)]
                         : c.sizes[static_cast<std::size_t>(j)];
}

Shape input_shape(const CclCall& c, int j) {
  check_call(c);
  MESHTEST_CHECK(j >= 0 && j < c.p(), "{} case: device index {} outside [0, {})",
                 ccl_case(c.op).name, j, c.p());
  const bool along_dim =
      c.op == CclOp::all_gather || c.op == CclOp::all_to_all || c.op == CclOp::all_to_all_v;
  return along_dim ? c.shape.with(c.dim, size_along_dim(c, j)) : c.shape;
}

/// Slice r along dim of device j's input.
/// input_shape checks j first: the table of device j is read only for a device of the call.
Tensor input_slice(const CclCall& c, int j, Range r) {
  const Shape shape = input_shape(c, j);
  return fill(shape, c.dim, r, input_lut(c.devices[static_cast<std::size_t>(j)], c.dtype));
}

Tensor input(const CclCall& c, int j) {
  const Shape shape = input_shape(c, j);
  return fill_all(shape, input_lut(c.devices[static_cast<std::size_t>(j)], c.dtype));
}

// ---- expected outputs ----------------------------------------------------------------------

Tensor gathered(const CclCall& c, int) {
  std::vector<Tensor> parts;
  for (int j = 0; j < c.p(); ++j) parts.push_back(input(c, j));
  return concat(parts, c.dim);
}

Tensor scattered_reduction(const CclCall& c, int i) {
  const Shape s = input_shape(c, i);
  return fill(s, c.dim, split_range(s[s.normalize_dim(c.dim)], c.p(), i), reduced_lut(c));
}

Tensor reduction(const CclCall& c, int i) { return fill_all(input_shape(c, i), reduced_lut(c)); }

Tensor exchanged(const CclCall& c, int i) {
  std::vector<Tensor> pieces;
  for (int j = 0; j < c.p(); ++j) {
    pieces.push_back(input_slice(c, j, exchange_range(c, j, i)));
  }
  return concat(pieces, c.concat_dim);
}

Tensor rooted(const CclCall& c, int) { return input(c, c.root); }

// ---- meshtest's runs -----------------------------------------------------------------------

Tensor run_all_gather(const MeshDevice& mesh, const Tensor& x, const CclCall& c) {
  return all_gather(mesh, x, {.dim = c.dim, .axis = c.axis});
}
Tensor run_reduce_scatter(const MeshDevice& mesh, const Tensor& x, const CclCall& c) {
  return reduce_scatter(mesh, x, {.dim = c.dim, .axis = c.axis, .op = c.reduce});
}
Tensor run_all_reduce(const MeshDevice& mesh, const Tensor& x, const CclCall& c) {
  return all_reduce(mesh, x, {.axis = c.axis, .op = c.reduce});
}
Tensor run_all_to_all(const MeshDevice& mesh, const Tensor& x, const CclCall& c) {
  return all_to_all(mesh, x, {.split_dim = c.dim, .concat_dim = c.concat_dim, .axis = c.axis});
}
Tensor run_all_to_all_v(const MeshDevice& mesh, const Tensor& x, const CclCall& c) {
  const std::span<const std::int64_t> row(
      c.counts.data() + static_cast<std::ptrdiff_t>(mesh.axis_index(c.axis)) * c.p(),
      static_cast<std::size_t>(c.p()));
  return all_to_all_v(mesh, x, row,
                      {.split_dim = c.dim, .concat_dim = c.concat_dim, .axis = c.axis});
}
Tensor run_broadcast(const MeshDevice& mesh, const Tensor& x, const CclCall& c) {
  return broadcast(mesh, x, {.root = c.root, .axis = c.axis});
}

constexpr CclCase kCases[] = {
    {.op = CclOp::all_gather,
     .name = "all_gather",
     .mpi_name = "MPI_Allgather",
     .bus_factor = &all_gather_bw::bus_factor,
     .ring_passes = 1,
     .input = input,
     .expected = gathered,
     .run = run_all_gather},
    {.op = CclOp::reduce_scatter,
     .name = "reduce_scatter",
     .mpi_name = "MPI_Reduce_scatter_block",
     .bus_factor = &reduce_scatter_bw::bus_factor,
     .ring_passes = 1,
     .input = input,
     .expected = scattered_reduction,
     .run = run_reduce_scatter},
    {.op = CclOp::all_reduce,
     .name = "all_reduce",
     .mpi_name = "MPI_Allreduce",
     .bus_factor = &all_reduce_bw::bus_factor,
     .ring_passes = 2,  // reduce_scatter + all_gather
     .input = input,
     .expected = reduction,
     .run = run_all_reduce},
    {.op = CclOp::all_to_all,
     .name = "all_to_all",
     .mpi_name = "MPI_Alltoall",
     .bus_factor = &all_to_all_bw::bus_factor,
     .ring_passes = 1,
     .input = input,
     .expected = exchanged,
     .run = run_all_to_all},
    {.op = CclOp::all_to_all_v,
     .name = "all_to_all_v",
     .mpi_name = "MPI_Alltoallv",
     .bus_factor = &all_to_all_bw::bus_factor,
     .ring_passes = 1,
     .input = input,
     .expected = exchanged,
     .run = run_all_to_all_v},
    {.op = CclOp::broadcast,
     .name = "broadcast",
     .mpi_name = "MPI_Bcast",
     .bus_factor = &broadcast_bw::bus_factor,
     .ring_passes = 1,
     .input = input,
     .expected = rooted,
     .run = run_broadcast},
};

}  // namespace

std::span<const CclCase> ccl_cases() { return kCases; }

const CclCase& ccl_case(CclOp op) {
  const auto i = static_cast<std::size_t>(op);
  MESHTEST_CHECK(i < std::size(kCases) && kCases[i].op == op, "no CCL case {}", i);
  return kCases[i];
}

Tensor case_values(int device, const Shape& shape, DType t) {
  return fill_all(shape, input_lut(device, t));
}

Range exchange_range(const CclCall& c, int from, int to) {
  MESHTEST_CHECK(c.op == CclOp::all_to_all || c.op == CclOp::all_to_all_v,
                 "exchange_range: {} exchanges nothing", ccl_case(c.op).name);
  const std::int64_t n = input_shape(c, from)[c.shape.normalize_dim(c.dim)];
  MESHTEST_CHECK(to >= 0 && to < c.p(), "exchange_range: device index {} outside [0, {})", to,
                 c.p());
  if (c.op == CclOp::all_to_all) return split_range(n, c.p(), to);
  const auto row = c.counts.begin() + static_cast<std::ptrdiff_t>(from) * c.p();
  return {.start = std::accumulate(row, row + to, std::int64_t{0}),
          .size = row[static_cast<std::ptrdiff_t>(to)]};
}

std::vector<int> axis_group(const MeshDevice& mesh, int axis, int device) {
  const int cols = mesh.cols(), r = device / cols, c = device % cols;
  std::vector<int> g;
  if (axis == 0) {
    for (int k = 0; k < mesh.rows(); ++k) g.push_back(k * cols + c);
  } else if (axis == 1) {
    for (int k = 0; k < cols; ++k) g.push_back(r * cols + k);
  } else {
    MESHTEST_CHECK(axis == kAllAxes, "axis_group: axis {} is not 0, 1 or kAllAxes", axis);
    for (int k = 0; k < mesh.size(); ++k) g.push_back(k);
  }
  return g;
}

std::int64_t count_wrong(const Tensor& got, const Tensor& want) {
  if (!(got.shape() == want.shape()) || got.dtype() != want.dtype())
    return std::max<std::int64_t>(1, got.numel());
  return visit_dtype(got.dtype(), [&]<class T>(type_tag<T>) {
    // Bits compared as unsigned integers of the element's size.
    using U = std::conditional_t<
        sizeof(T) == 1, std::uint8_t,
        std::conditional_t<sizeof(T) == 2, std::uint16_t,
                           std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
    static_assert(sizeof(U) == sizeof(T));
    std::int64_t wrong = 0;
    for (std::int64_t k = 0; k < got.numel(); ++k) {
      U a, b;
      std::memcpy(&a, got.bytes() + k * std::int64_t{sizeof(T)}, sizeof(T));
      std::memcpy(&b, want.bytes() + k * std::int64_t{sizeof(T)}, sizeof(T));
      wrong += a != b ? 1 : 0;
    }
    return wrong;
  });
}

}  // namespace meshtest::dist
