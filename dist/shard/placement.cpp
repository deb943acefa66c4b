// Placements: printing, validation, local shapes and distribute (all local, no communication).
#include "dist/shard/placement.hpp"

#include "dist/mesh/mpi_check.hpp"

namespace meshtest::dist {

namespace {

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

const Partial* as_partial(const Placement& p) { return std::get_if<Partial>(&p); }

/// The zeros of a non-zero Partial(sum) slot: -0.0 for floating dtypes (x + -0.0 == x bit for
/// bit, -0.0 included), 0 for integers.
Tensor sum_identity(const Shape& shape, DType dtype) {
  Tensor z(shape, dtype);
  if (is_floating(dtype)) z.fill(-0.0);
  return z;
}

}  // namespace

std::string str(const Placement& p) {
  return std::visit(
      overloaded{[](const Replicate&) { return std::string("Replicate"); },
                 [](const Shard& s) { return fmt::format("Shard({})", s.dim); },
                 [](const Partial& q) { return fmt::format("Partial({})", reduce_op_name(q.op)); }},
      p);
}

std::string str(const Placements& p) { return fmt::format("[{}, {}]", str(p[0]), str(p[1])); }

Placements validate_placements(const Placements& p, const Shape& shape, DType dtype) {
  Placements out = p;
  for (int axis = 0; axis < 2; ++axis) {
    Placement& q = out[static_cast<std::size_t>(axis)];
    if (auto* s = std::get_if<Shard>(&q)) {
      MESHTEST_DIST_CHECK(s->dim >= -shape.rank() && s->dim < shape.rank(),
                          "placements {}: {} on mesh axis {} is out of range for a tensor of "
                          "rank {} (shape {}); expected a dim in [{}, {})",
                          str(p), str(q), axis, shape.rank(), shape, -shape.rank(), shape.rank());
      if (s->dim < 0) s->dim += shape.rank();
    } else if (const Partial* part = as_partial(q)) {
      MESHTEST_DIST_CHECK(dtype != DType::u8,
                          "placements {}: {} on mesh axis {} cannot hold a u8 tensor (packed "
                          "formats cannot be reduced)",
                          str(p), str(q), axis);
      MESHTEST_DIST_CHECK(part->op != ReduceOp::avg || is_floating(dtype),
                          "placements {}: {} on mesh axis {} needs a floating dtype, got {}",
                          str(p), str(q), axis, dtype);
    }
  }
  const Partial* p0 = as_partial(out[0]);
  const Partial* p1 = as_partial(out[1]);
  MESHTEST_DIST_CHECK(!p0 || !p1 || p0->op == p1->op,
                      "placements {}: Partial on both mesh axes must use the same op (got {} on "
                      "axis 0 and {} on axis 1)",
                      str(p), reduce_op_name(p0 ? p0->op : ReduceOp::sum),
                      reduce_op_name(p1 ? p1->op : ReduceOp::sum));
  return out;
}

Shape local_shape(const Shape& global, const MeshDevice& mesh, const Placements& p) {
  const Placements q = validate_placements(p, global, DType::f32);
  Shape s = global;
  for (int axis = 0; axis < 2; ++axis) {
    if (const auto* sh = std::get_if<Shard>(&q[static_cast<std::size_t>(axis)])) {
      s = s.with(sh->dim,
                 split_range(s[sh->dim], mesh.axis_size(axis), mesh.axis_index(axis)).size);
    }
  }
  return s;
}

Tensor distribute_axis(const Tensor& x, const MeshDevice& mesh, int axis, const Placement& p) {
  MESHTEST_DIST_CHECK(axis == 0 || axis == 1,
                      "distribute_axis: mesh axis {} out of range; expected 0 or 1", axis);
  const Placement q = validate_placements({Replicate{}, p}, x.shape(), x.dtype())[1];
  if (const auto* s = std::get_if<Shard>(&q)) {
    return x.slice(s->dim,
                   split_range(x.shape()[s->dim], mesh.axis_size(axis), mesh.axis_index(axis)));
  }
  if (const Partial* part = as_partial(q)) {
    if (part->op == ReduceOp::sum && mesh.axis_index(axis) != 0) {
      return sum_identity(x.shape(), x.dtype());
    }
  }
  return x;
}

Tensor distribute(const Tensor& full, const MeshDevice& mesh, const Placements& p) {
  const Placements q = validate_placements(p, full.shape(), full.dtype());
  return distribute_axis(distribute_axis(full, mesh, 0, q[0]), mesh, 1, q[1]);
}

}  // namespace meshtest::dist
