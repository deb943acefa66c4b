// meshtest-bench: the benchmarks (./launch/meshtest bench <subcommand> -np N ...).
#include "tools/subcommand.hpp"

int main(int argc, char** argv) {
  return meshtest::tools::dispatch(
      "meshtest-bench",
      "meshtest-bench: benchmarks, each against a baseline measured in the same run", argc, argv);
}
