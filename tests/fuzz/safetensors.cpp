// Fuzz target safetensors: SafetensorsFile::from_bytes, then every tensor read whole and its
// first row read as a slice.
#include "src/core/safetensors.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  const SafetensorsFile f = SafetensorsFile::from_bytes(in.bytes(), "fuzz.safetensors");
  for (const std::string& name : f.names()) {
    const TensorInfo& info = f.info(name);
    const Tensor t = f.read(name);
    fuzz::require(t.shape() == info.shape && t.nbytes() == info.end - info.begin,
                  "a tensor read has the header's shape and data_offsets' size");
    fuzz::touch({t.bytes(), t.nbytes()});
    if (t.rank() > 0 && t.shape()[0] > 0) {
      fuzz::require(f.read_slice(name, 0, {0, 1}).bitwise_equal(t.slice(0, 0, 1)),
                    "read_slice equals the slice of read");
    }
  }
  for (const auto& [key, value] : f.metadata()) fuzz::touch(std::as_bytes(std::span(value)));
}
