// CCL cases of the demo: deterministic inputs, the run on the mesh and the single-device reference.
#include "tools/ccl_cases.hpp"

#include <numeric>

#include "dist/ccl/ccl.hpp"
#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

namespace {

/// Device ids of the group along `axis` that holds device `d`, in axis order.
std::vector<int> group_of(const MeshDevice& m, int axis, int d) {
  std::vector<int> g;
  const int r = d / m.cols(), c = d % m.cols();
  if (axis == kAllAxes) {
    for (int k = 0; k < m.size(); ++k) g.push_back(k);
  } else if (axis == 0) {
    for (int k = 0; k < m.rows(); ++k) g.push_back(k * m.cols() + c);
  } else {
    for (int k = 0; k < m.cols(); ++k) g.push_back(r * m.cols() + k);
  }
  return g;
}

std::int64_t rows_of(const Case& cs, int d) {
  if (cs.op != Op::all_to_all_v) return cs.rows;
  const auto n = send_counts(cs, d);
  return std::accumulate(n.begin(), n.end(), std::int64_t{0});
}

}  // namespace

const char* op_name(Op op) {
  static constexpr std::array<const char*, 7> kNames = {
      "all_gather", "reduce_scatter", "all_reduce(sum)", "all_reduce(avg)",
      "all_to_all", "all_to_all_v",   "broadcast"};
  return kNames[static_cast<std::size_t>(op)];
}

std::vector<std::int64_t> send_counts(const Case& cs, int d) {
  const int p = cs.mesh->axis_size(cs.axis);
  std::vector<std::int64_t> n(static_cast<std::size_t>(p));
  for (int j = 0; j < p; ++j) n[static_cast<std::size_t>(j)] = cs.rows / p + (d + j) % 3;
  return n;
}

Shape global_shape(const Case& cs) {
  std::int64_t rows = 0;
  for (int d = 0; d < cs.mesh->size(); ++d) rows += rows_of(cs, d);
  return {rows, kCols};
}

Tensor device_input(const Case& cs, int d) {
  std::int64_t off = 0;
  for (int k = 0; k < d; ++k) off += rows_of(cs, k);
  Tensor t({rows_of(cs, d), kCols}, DType::f64);
  const double scale = cs.op == Op::all_reduce_avg ? cs.mesh->axis_size(cs.axis) : 1.0;
  auto v = t.span<double>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::int64_t g = off * kCols + static_cast<std::int64_t>(i);
    v[i] = scale * static_cast<double>((g * 37 + 5) % 23 - 11);
  }
  return t.astype(cs.dtype);
}

/// The op on the mesh: collective over the devices of cs.axis.
Tensor run(const Case& cs, const Tensor& x) {
  const MeshDevice& m = *cs.mesh;
  const int a = cs.axis;
  switch (cs.op) {
    case Op::all_gather:
      return all_gather(m, x, {.dim = 0, .axis = a});
    case Op::reduce_scatter:
      return reduce_scatter(m, x, {.dim = 0, .axis = a});
    case Op::all_reduce_sum:
      return all_reduce(m, x, {.axis = a});
    case Op::all_reduce_avg:
      return all_reduce(m, x, {.axis = a, .op = ReduceOp::avg});
    case Op::all_to_all:
      return all_to_all(m, x, {.split_dim = 0, .concat_dim = 1, .axis = a});
    case Op::all_to_all_v:
      return all_to_all_v(m, x, send_counts(cs, m.device_id()), {.axis = a});
    case Op::broadcast:
      return broadcast(m, x, {.root = 0, .axis = a});
  }
  fail("unknown op");
}

/// The same op done on one device from the inputs of this device's group: no communication.
Tensor reference(const Case& cs) {
  const MeshDevice& m = *cs.mesh;
  const std::vector<int> g = group_of(m, cs.axis, m.device_id());
  const int p = static_cast<int>(g.size());
  const auto i = static_cast<std::size_t>(m.axis_index(cs.axis));
  std::vector<Tensor> in, parts;
  for (int d : g) in.push_back(device_input(cs, d));
  switch (cs.op) {
    case Op::all_gather:
      return concat(in, 0);
    case Op::broadcast:
      return in[0];
    case Op::all_to_all:
      for (const Tensor& t : in) parts.push_back(split(t, p, 0)[i]);
      return concat(parts, 1);
    case Op::all_to_all_v:
      for (std::size_t k = 0; k < in.size(); ++k) {
        const auto n = send_counts(cs, g[k]);
        const auto off =
            std::accumulate(n.begin(), n.begin() + static_cast<std::ptrdiff_t>(i), std::int64_t{0});
        parts.push_back(in[k].slice(0, off, n[i]));
      }
      return concat(parts, 0);
    default:
      break;
  }
  // Element-wise sums in f64 (exact for these integers), then the op's dtype.
  Tensor sum = in[0].astype(DType::f64);
  for (std::size_t k = 1; k < in.size(); ++k) {
    sum.vector<double>() += in[k].astype(DType::f64).vector<double>();
  }
  if (cs.op == Op::all_reduce_avg) sum.vector<double>() /= p;
  if (cs.op == Op::reduce_scatter) {
    sum = sum.slice(0, split_range(sum.shape()[0], p, static_cast<int>(i)));
  }
  return sum.astype(cs.dtype);
}

}  // namespace meshtest::dist
