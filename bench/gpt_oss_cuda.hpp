// gpt_oss_cuda: meshtest-bench gpt-oss --device cuda (bench/gpt_oss_cuda.cpp), reached from the
// gpt-oss subcommand (bench_gpt_oss.cpp) in a build with the GPU side.
#pragma once

namespace meshtest::bench {

/// The GPU tables' main: MPI up, its own options (--help lists them), exit 0, or 2 for bad
/// options or no GPU ranks.
int gpt_oss_cuda_main(int argc, char** argv);

}  // namespace meshtest::bench
