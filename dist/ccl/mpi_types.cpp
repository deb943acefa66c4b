// mpi_types: MPI's datatypes and ops of meshtest's dtypes; bf16 and f16 get a committed
// 2-byte type each and their own ops, made on first use.
#include "dist/ccl/mpi_types.hpp"

#include <Eigen/Core>
#include <array>
#include <cstddef>

#include "dist/mesh/mpi_check.hpp"
#include "src/core/tensor.hpp"

namespace meshtest::dist {
namespace {

// 2-byte float reductions (bf16, f16: H) compute in f32 and round the result to H (a device's
// dtype behaviour).
template <class H, class F>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  using Array = Eigen::Array<H, Eigen::Dynamic, 1>;
  const Eigen::Map<const Array> a(static_cast<const H*>(in), *len);
  Eigen::Map<Array> b(static_cast<H*>(inout), *len);
  b = F{}(a.template cast<float>(), b.template cast<float>()).template cast<H>();
}
struct Sum {
  auto operator()(const auto& a, const auto& b) const { return a + b; }
};
struct Max {
  auto operator()(const auto& a, const auto& b) const { return a.max(b); }
};
struct Min {
  auto operator()(const auto& a, const auto& b) const { return a.min(b); }
};

// The datatype and ops of one 2-byte float, created on first use and freed when MPI_Finalize
// deletes MPI_COMM_SELF's attributes.
struct HalfRegistry {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  std::array<MPI_Op, 3> ops{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum, max, min
};

int free_half(MPI_Comm, int, void* attr, void*) {
  auto* r = static_cast<HalfRegistry*>(attr);
  for (MPI_Op& op : r->ops) MPI_Op_free(&op);
  MPI_Type_free(&r->type);
  return MPI_SUCCESS;
}

template <class H>
HalfRegistry& half_registry() {
  static HalfRegistry r = [] {
    HalfRegistry n;
    MESHTEST_MPI(MPI_Type_contiguous(2, MPI_BYTE, &n.type));
    MESHTEST_MPI(MPI_Type_commit(&n.type));
    MESHTEST_MPI(MPI_Op_create(&half_reduce<H, Sum>, 1, &n.ops[0]));
    MESHTEST_MPI(MPI_Op_create(&half_reduce<H, Max>, 1, &n.ops[1]));
    MESHTEST_MPI(MPI_Op_create(&half_reduce<H, Min>, 1, &n.ops[2]));
    return n;
  }();
  static const bool registered = [] {
    int key = MPI_KEYVAL_INVALID;
    MESHTEST_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_half, &key, nullptr));
    MESHTEST_MPI(MPI_Comm_set_attr(MPI_COMM_SELF, key, &r));
    return true;
  }();
  (void)registered;
  return r;
}

}  // namespace

MPI_Op mpi_op(ReduceOp op, DType t) {
  const int i = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
  if (t == DType::bf16) return half_registry<bf16>().ops[static_cast<std::size_t>(i)];
  if (t == DType::f16) return half_registry<f16>().ops[static_cast<std::size_t>(i)];
  return i == 1 ? MPI_MAX : i == 2 ? MPI_MIN : MPI_SUM;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::bf16:
      return half_registry<bf16>().type;
    case DType::f16:
      return half_registry<f16>().type;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
  }
  dist::fail("invalid DType value {}", static_cast<int>(t));
}

}  // namespace meshtest::dist
