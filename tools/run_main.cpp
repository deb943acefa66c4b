// meshtest-run: run a model or a training step on given data, single-device or sharded
// (./launch/meshtest run -np N build/bin/meshtest-run <subcommand> ...).
#include "tools/subcommand.hpp"

int main(int argc, char** argv) {
  return meshtest::tools::dispatch(
      "meshtest-run",
      "meshtest-run: run a model or a DP-SGD step on your data, on one device or sharded", argc,
      argv);
}
