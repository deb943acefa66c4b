// Fuzz target npy: read_npy_bytes; a parsed tensor must survive npy_bytes and a second read.
#include "src/core/npy.hpp"
#include "tests/fuzz/fuzz_target.hpp"

using namespace meshtest;

MESHTEST_FUZZ_TARGET(in) {
  const Tensor t = read_npy_bytes(in.bytes(), "fuzz.npy");
  fuzz::require(t.nbytes() == static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()) &&
                    t.nbytes() < in.size,
                "the tensor's bytes are its shape times its dtype size, and inside the file");
  fuzz::touch({t.bytes(), t.nbytes()});
  const Tensor again = fuzz::must([&] { return read_npy_bytes(npy_bytes(t), "rewritten.npy"); });
  fuzz::require(again.bitwise_equal(t), "npy_bytes then read_npy_bytes gives the tensor back");
}
