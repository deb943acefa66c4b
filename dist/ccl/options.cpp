// The names of the reduction ops.
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

}  // namespace meshtest::dist
