# test.bash — `meshtest test`: setup, build, then ctest over every unit and MPI test, with
# JUnit in reports/, the wall time, and a check that the tests left no temporary files.
# Sourced by launch/meshtest.

usage_test() {
  cat <<EOF
Usage: $PROG test [build options] [--no-setup] [--no-build] [--perf [--record]] [CTEST_ARGS...]

setup + build, then every unit and MPI test but the perf checks (label perf):
  ctest --test-dir build --output-on-failure -j\$MESHTEST_CTEST_JOBS -LE '^perf\$' \\
        --output-junit reports/ctest-junit.xml CTEST_ARGS
and prints the wall time. No verdict of this suite depends on the clock. Any argument that is
not an option below goes to ctest, e.g. '$PROG test -L mpi', '$PROG test -R ccl',
'$PROG test -- -LE np8' (label perf stays out),
'$PROG test -LE scale' (without the runs at 6, 12, 16 and 32 ranks).
The tests' temporary files go to build/test-tmp (MESHTEST_TMPDIR); files left
there when ctest ends are listed and fail the run.

$(build_options_help)
  --no-setup        skip the package check
  --no-build        run ctest on the existing build
  --perf            only the perf checks (label perf), one at a time: the fused ops' device
                    times against the expectations recorded on this machine in
                    build/perf-expected, and each single-device run against the multi-device
                    run of the same test (docs/fused-op-tests.md); JUnit in
                    reports/perf-junit.xml
  --record          with --perf: measure and record this machine's expectations (replacing
                    build/perf-expected) instead of checking them
EOF
}

# exclude_label <label> <ctest args...>: the ctest arguments with the tests labelled <label>
# left out: merged into the first -LE / --label-exclude given, else appended as -LE; printed
# NUL-separated.
exclude_label() {
  local label=$1 merged=0
  shift
  local -a out=()
  while [[ $# -gt 0 ]]; do
    if [[ $merged -eq 0 && $# -ge 2 && ( "$1" == -LE || "$1" == --label-exclude ) ]]; then
      out+=("$1" "(^$label\$)|($2)")
      merged=1
      shift 2
      continue
    fi
    out+=("$1")
    shift
  done
  [[ $merged -eq 1 ]] || out+=(-LE "^$label\$")
  printf '%s\0' "${out[@]}"
}

# junit_counts <file>: "passed failed skipped" from the status of each
# <testcase> in ctest's JUnit file (skipped = not run or disabled).
junit_counts() {
  [[ -f "$1" ]] || { echo "0 0 0"; return; }
  awk '/<testcase / && match($0, /status="[a-z]+"/) { n[substr($0, RSTART + 8, RLENGTH - 9)]++ }
       END { printf "%d %d %d\n", n["run"], n["fail"], n["notrun"] + n["disabled"] }' "$1"
}

cmd_test() {
  local setup=1 build=1 perf=0 record=0 start rc=0
  local -a ctest_args=()
  start=$(now)
  while [[ $# -gt 0 ]]; do
    build_opt test "$@"
    if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    case "$1" in
      --no-setup) setup=0; shift ;;
      --no-build) build=0; shift ;;
      --perf) perf=1; shift ;;
      --record) record=1; shift ;;
      -h | --help) usage_test; return 0 ;;
      --) shift; ctest_args+=("$@"); break ;;
      *) ctest_args+=("$1"); shift ;;
    esac
  done
  [[ $record -eq 0 || $perf -eq 1 ]] ||
    usage_error test "--record records the perf expectations: give it with --perf"
  [[ $setup -eq 0 ]] || do_setup 0 0
  [[ $build -eq 0 ]] || do_build
  local dir junit
  dir=$(build_dir)
  [[ -f "$dir/CTestTestfile.cmake" ]] || die "test: $(show "$dir") is not configured; run '$PROG build'"
  mkdir -p "$REPORTS"
  local -a jobs=(-j"$CTEST_JOBS")
  if [[ $perf -eq 1 ]]; then
    # The perf checks, one test at a time, against this machine's own expectations (the tests'
    # MESHTEST_PERF_EXPECTED is <build>/perf-expected).
    local expected=$dir/perf-expected
    if [[ $record -eq 1 ]]; then
      rm -rf "$expected"
      export MESHTEST_PERF_RECORD=1
      say "recording this machine's perf expectations in $(show "$expected")"
    else
      [[ -f "$expected/machine.json" ]] ||
        die "test --perf: no perf expectations recorded on this machine" \
          "($(show "$expected/machine.json") is missing): run '$PROG test --perf --record' first"
      unset MESHTEST_PERF_RECORD
    fi
    junit=$REPORTS/perf-junit.xml
    jobs=(-j1 -V)  # one at a time, each with its tables
    ctest_args=(-L '^perf$' ${ctest_args[@]+"${ctest_args[@]}"})
  else
    junit=$REPORTS/ctest-junit.xml
    mapfile -d '' -t ctest_args < <(exclude_label perf ${ctest_args[@]+"${ctest_args[@]}"})
  fi
  rm -f "$junit"
  export GTEST_COLOR=${GTEST_COLOR:-no}
  # The tests' temporary files (tests/support/temp_dir.hpp) go to one fresh folder, which must
  # be empty again when ctest ends: a test that leaves files behind fails the run.
  local tmp
  tmp=$(cd "$dir" && pwd)/test-tmp
  { rm -rf "$tmp" && mkdir -p "$tmp"; } || die "test: cannot make $(show "$tmp")"
  export MESHTEST_TMPDIR=$tmp
  local -a cmd=(ctest --test-dir "$dir" --output-on-failure "${jobs[@]}" --output-junit "$junit"
    "${ctest_args[@]}")
  say "testing (ctest --test-dir $(show "$dir") --output-on-failure ${jobs[*]}" \
    "--output-junit $(show "$junit") ${ctest_args[*]})"
  local ctest_start
  ctest_start=$(now)
  "${cmd[@]}" || rc=$?
  local left
  left=$(find "$tmp" -mindepth 1 -maxdepth 3 2>/dev/null | sed "s|^$tmp/||" | head -n 20)
  if [[ -n "$left" ]]; then
    local -a left_lines
    mapfile -t left_lines <<<"$left"
    warn "test: the tests left files behind in $(show "$tmp"):"
    printf '  %s\n' "${left_lines[@]}" >&2
    [[ $rc -ne 0 ]] || rc=1
  fi
  local p f s
  read -r p f s < <(junit_counts "$junit") || true
  say "test: wall time $(hms "$(seconds_since "$start")") (ctest $(hms "$(seconds_since "$ctest_start")")," \
    "exit $rc); JUnit: $(show "$junit")"
  echo "ctest: ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
  if [[ $perf -eq 0 ]]; then
    echo "perf checks (label perf) are not part of this run: '$PROG test --perf' runs them"
  elif [[ $record -eq 1 && $rc -eq 0 ]]; then
    echo "perf: $(find "$dir/perf-expected" -name measurements.json | wc -l) expectations" \
      "recorded in $(show "$dir/perf-expected"); '$PROG test --perf' checks them"
  fi
  return "$rc"
}
