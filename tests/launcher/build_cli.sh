#!/usr/bin/env bash
# launch/meshtest's GPU build options: build, test and the other building subcommands list
# --cuda and --no-cuda; giving both is a usage error (exit 2) that says so. Nothing is built.
# Usage: build_cli.sh <path of launch/meshtest>
set -euo pipefail
launcher=$1
# shellcheck source=tests/launcher/common.bash
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"

for sub in build test demo; do
  expect 0 "--cuda            build the GPU side (-DMESHTEST_CUDA=ON)" "$launcher" "$sub" --help
  expect 0 "--no-cuda         CPU ranks only (-DMESHTEST_CUDA=OFF)" "$launcher" "$sub" --help
done
expect 2 "--cuda and --no-cuda contradict each other" "$launcher" build --cuda --no-cuda
expect 2 "--cuda and --no-cuda contradict each other" "$launcher" test --no-cuda --cuda
echo "build --cuda / --no-cuda: listed, contradiction refused"
