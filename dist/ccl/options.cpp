// The names of the reduction ops and numerics.
#include "dist/ccl/options.hpp"

namespace meshtest::dist {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

std::string_view numerics_name(Numerics n) {
  switch (n) {
    case Numerics::from_env:
      return "from_env";
    case Numerics::exact:
      return "exact";
    case Numerics::nccl:
      return "nccl";
  }
  return "?";
}

}  // namespace meshtest::dist
