// Shape, rank and dtype checks shared by the reference ops.
#include "src/ops/compute.hpp"

namespace meshtest::detail {

void check_shape(std::string_view op, std::string_view name, const Tensor& t, const Shape& want) {
  MESHTEST_CHECK(t.shape() == want, "{}: {} has shape {}, expected {}", op, name, t.shape(), want);
}

void check_dtype(std::string_view op, std::string_view name, const Tensor& t, DType want) {
  MESHTEST_CHECK(t.dtype() == want, "{}: {} has dtype {}, expected {}", op, name, t.dtype(), want);
}

void check_rank(std::string_view op, std::string_view name, const Tensor& t, int rank) {
  MESHTEST_CHECK(t.rank() == rank, "{}: {} has shape {} (rank {}), expected rank {}", op, name,
                 t.shape(), t.rank(), rank);
}

}  // namespace meshtest::detail
