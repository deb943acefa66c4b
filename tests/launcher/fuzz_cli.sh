#!/usr/bin/env bash
# launch/meshtest fuzz's bad input: an unknown target (the message lists the targets), a bad
# --seconds or --max-len, --sanitize; and --help naming every target of tests/fuzz. Each ends at
# once (usage: exit 2) before anything is built.
# Usage: fuzz_cli.sh <path of launch/meshtest>
set -euo pipefail
launcher=$1
# shellcheck source=tests/launcher/common.bash
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"

targets="npy safetensors ops_csv ccl_bench_json gpt_oss_config mxfp4 flight"
expect 2 "unknown target 'nope' (the targets: $targets)" "$launcher" fuzz npy nope
expect 2 "--seconds needs a positive integer, not '0'" "$launcher" fuzz --seconds 0
expect 2 "--seconds needs a positive integer, not 'ten'" "$launcher" fuzz npy --seconds=ten
expect 2 "--max-len needs a positive integer, not '-1'" "$launcher" fuzz --max-len -1
expect 2 "option --seconds needs a value" "$launcher" fuzz --seconds
expect 2 "--parallel needs a positive integer, not '0'" "$launcher" fuzz --parallel 0
expect 2 "unknown option '--jobs'" "$launcher" fuzz --jobs 2
expect 2 "--sanitize, --native and --debug do not apply" "$launcher" fuzz --sanitize
expect 0 "Targets (tests/fuzz/<target>.cpp): $targets" "$launcher" fuzz --help
expect 0 "fuzz [TARGET]" "$launcher" --help
echo "fuzz: bad input refused with a clear message"
