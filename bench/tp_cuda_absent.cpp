// meshtest-bench tp-gpu in a build without the GPU side: the subcommand is listed everywhere
// (README's table, --help) and says why it cannot run here instead of being unknown.
#include <fmt/format.h>

#include <cstdio>

#include "tools/subcommand.hpp"

namespace meshtest::bench {
namespace {

int bench_tp_gpu_absent(int /*argc*/, char** /*argv*/) {
  fmt::print(stderr,
             "meshtest-bench tp-gpu: this meshtest-bench was built without the GPU side "
             "(configure with -DMESHTEST_CUDA=ON, or ./launch/meshtest build --cuda; "
             "docs/gpu.md)\n");
  return 2;
}

const tools::RegisterSubcommand reg{
    {"tp-gpu", "gpt-oss TP linear pair on GPUs (bf16) against bare cuBLAS, and the scope cost",
     &bench_tp_gpu_absent}};

}  // namespace
}  // namespace meshtest::bench
