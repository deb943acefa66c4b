# bench.bash — `meshtest bench`: builds build/bin/meshtest-bench and runs one of its
# benchmarks on N ranks through cmd_run. Its help lists the benchmarks that binary registers
# (meshtest-bench --help), so the list cannot drift. Sourced by launch/meshtest.

# bench_registry <meshtest-bench>: its benchmarks, one a line as its --help prints them
# ("  <name>   <what it measures>"); fails when the binary is missing or lists none.
bench_registry() {
  local lines
  [[ -x "$1" && -f "$1" ]] || return 1
  lines=$(timeout 30 "$1" --help 2>/dev/null | grep -E '^  [a-z0-9]') || return 1
  echo "$lines"
}

# bench_list: the benchmarks paragraph of usage_bench, from the build's meshtest-bench.
bench_list() {
  local bench lines
  bench="$(build_dir)/bin/meshtest-bench"
  if lines=$(bench_registry "$bench"); then
    echo "Benchmarks (bench/bench_<name>.cpp), as $(show "$bench") --help lists them:"
    echo "$lines"
  else
    echo "Benchmarks (bench/bench_<name>.cpp): $(show "$bench") is not built yet, so"
    echo "this help cannot list them. '$PROG bench <name>' builds it (so does '$PROG build');"
    echo "then this help lists every benchmark it registers."
  fi
}

usage_bench() {
  cat <<EOF
Usage: $PROG bench [build options] <name> [-np N] [NAME_OPTIONS...]
       $PROG bench <name> --help        the benchmark's own options

Builds build/bin/meshtest-bench, then runs its subcommand <name> on N ranks
(default: $JOBS, the cores). Every option after <name> but -np / --np goes to
the benchmark (so its own -n, -b, ... keep nccl-tests' meaning). Rank 0 prints.

$(bench_list)

Examples:
  $PROG bench ccl -np 4 -b 64K -e 32M -f 2 --json ccl.json
  $PROG bench gpt-oss -np 1 --tokens 1,8
  $PROG bench dpsgd -np 1 --seq 64,256

$(build_options_help)
EOF
}

cmd_bench() {
  local np=$JOBS name="" help=0
  local -a args=()
  while [[ $# -gt 0 ]]; do
    if [[ -z "$name" ]]; then
      build_opt bench "$@"
      if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    fi
    case "$1" in
      -np | --np) need_value bench "$@"; np=$2; shift 2 ;;
      --np=*) np=${1#--np=}; shift ;;
      -h | --help)
        if [[ -z "$name" ]]; then usage_bench; return 0; fi
        help=1; args+=("$1"); shift ;;
      --) shift ;;
      -*)
        [[ -n "$name" ]] || usage_error bench "unknown option '$1' before the benchmark's name"
        args+=("$1"); shift ;;
      *) if [[ -z "$name" ]]; then name=$1; else args+=("$1"); fi; shift ;;
    esac
  done
  [[ -n "$name" ]] || usage_error bench "missing the benchmark's name (e.g. '$PROG bench ccl -np 2')"
  is_posint "$np" || usage_error bench "-np needs a positive integer, not '$np'"
  np=$((10#$np))
  do_build meshtest-bench
  local bench
  bench="$(build_dir)/bin/meshtest-bench"
  [[ -x "$bench" ]] || die "bench: no $(show "$bench") after the build"
  # --help needs no ranks: run it directly.
  if [[ $help -eq 1 ]]; then exec "$bench" "$name" "${args[@]}"; fi
  cmd_run --no-tag-output -np "$np" "$bench" "$name" ${args[@]+"${args[@]}"}
}
