// Test helper: rewrite a .safetensors file after editing its list of tensors (to corrupt a
// checkpoint on purpose).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "src/core/error.hpp"
#include "src/core/safetensors.hpp"

namespace meshtest::test_support {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// Reads every tensor of `path`, lets `f` change the list, and writes the file again.
inline void edit_safetensors(const std::filesystem::path& path,
                             const std::function<void(NamedTensors&)>& f) {
  NamedTensors all;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const std::string& name : file.names()) all.emplace_back(name, file.read(name));
  }
  f(all);
  write_safetensors(path, all);
}

/// The tensor `name` of the list; throws Error if absent.
inline Tensor& find_tensor(NamedTensors& all, const std::string& name) {
  for (auto& [n, t] : all) {
    if (n == name) return t;
  }
  fail("test: no tensor '{}' in the list", name);
}

}  // namespace meshtest::test_support
