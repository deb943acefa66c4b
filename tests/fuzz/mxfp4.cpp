// Fuzz target mxfp4: a .safetensors image holding MXFP4 pairs "<name>.blocks" and
// "<name>.scales", checked from the header (as a checkpoint does) and decoded.
#include "src/ops/mxfp4.hpp"
#include "src/core/safetensors.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  const SafetensorsFile f = SafetensorsFile::from_bytes(in.bytes(), "fuzz.safetensors");
  for (const std::string& blocks : f.names()) {
    if (!blocks.ends_with(".blocks")) continue;
    const std::string scales = blocks.substr(0, blocks.size() - 7) + ".scales";
    const TensorInfo& b = f.info(blocks);
    const TensorInfo& s = f.info(scales);
    check_mxfp4(b.shape, b.dtype, s.shape, s.dtype, blocks);
    const Shape shape = mxfp4_decoded_shape(b.shape);
    const Tensor x = mxfp4_decode(f.read(blocks), f.read(scales), DType::f32);
    fuzz::require(x.shape() == shape, "decode gives the decoded shape of the header's blocks");
    fuzz::touch({x.bytes(), x.nbytes()});
  }
}
