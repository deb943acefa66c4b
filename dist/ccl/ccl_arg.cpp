// ccl_arg: operand views of host tensors, and their names in messages.
#include "dist/ccl/ccl_arg.hpp"

#include <fmt/format.h>

namespace meshtest::dist {

std::string to_string(Memory m) {
  return m.is_host() ? std::string("host") : fmt::format("cuda:{}", m.ordinal);
}

std::string_view kind_name(Memory m) { return m.is_host() ? "host" : "cuda"; }

CclArg host_arg(const Tensor& t) {
  return {.data = const_cast<std::byte*>(t.bytes()),  // an input is only read (see CclArg)
          .shape = t.shape(),
          .dtype = t.dtype(),
          .where = Memory::host(),
          .tensor = &t};
}

std::string describe(const CclArg& x) {
  const std::string s = fmt::format("{}{}", x.dtype, x.shape);
  return x.where.is_host() ? s : fmt::format("{} on {}", s, to_string(x.where));
}

MakeOutput host_output(Tensor& out) {
  return [&out](const Shape& shape, DType dtype) {
    out = Tensor(shape, dtype, Tensor::Uninitialized{});
    return host_arg(out);
  };
}

}  // namespace meshtest::dist
