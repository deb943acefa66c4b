// families: the registry of kernel families (every family's header is included here only, so
// that a family may include family.hpp without a cycle).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "src/core/error.hpp"
#include "src/kernels/family.hpp"
#include "src/kernels/fp8_matmul.hpp"
#include "src/kernels/mxfp4_matmul.hpp"

namespace meshtest::kernels {

const std::vector<Family>& families() {
  static const std::vector<Family> all = {fp8_matmul_family(), mxfp4_matmul_family()};
  return all;
}

const Family& family(std::string_view name) {
  std::vector<std::string> names;
  for (const Family& f : families()) {
    if (f.name == name) return f;
    names.push_back(f.name);
  }
  fail("no kernel family '{}' (the families: {})", name, fmt::join(names, ", "));
}

const Version& version(const Family& f, std::string_view name) {
  std::vector<std::string> names;
  for (const Version& v : f.versions) {
    if (v.name == name) return v;
    names.push_back(v.name);
  }
  fail("kernel family {} has no version '{}' (its versions: {})", f.name, name,
       fmt::join(names, ", "));
}

}  // namespace meshtest::kernels
