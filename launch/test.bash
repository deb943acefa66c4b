# test.bash — `meshtest test`: setup, build, then ctest over every unit and MPI test, with
# JUnit in reports/, the wall time, and a check that the tests left no temporary files.
# Sourced by launch/meshtest.

usage_test() {
  cat <<EOF
Usage: $PROG test [build options] [--no-setup] [--no-build] [CTEST_ARGS...]

setup + build, then
  ctest --test-dir build --output-on-failure -j\$MESHTEST_JOBS \\
        --output-junit reports/ctest-junit.xml CTEST_ARGS
and prints the wall time. Any argument that is not an option below goes to
ctest, e.g. '$PROG test -L mpi', '$PROG test -R ccl', '$PROG test -- -LE np8',
'$PROG test -LE scale' (without the runs at 6, 12, 16 and 32 ranks).
The tests' temporary files go to build/test-tmp (MESHTEST_TMPDIR); files left
there when ctest ends are listed and fail the run.

$(build_options_help)
  --no-setup        skip the package check
  --no-build        run ctest on the existing build
EOF
}

# junit_counts <file>: "passed failed skipped" from the status of each
# <testcase> in ctest's JUnit file (skipped = not run or disabled).
junit_counts() {
  [[ -f "$1" ]] || { echo "0 0 0"; return; }
  awk '/<testcase / && match($0, /status="[a-z]+"/) { n[substr($0, RSTART + 8, RLENGTH - 9)]++ }
       END { printf "%d %d %d\n", n["run"], n["fail"], n["notrun"] + n["disabled"] }' "$1"
}

cmd_test() {
  local setup=1 build=1 start rc=0
  local -a ctest_args=()
  start=$(now)
  while [[ $# -gt 0 ]]; do
    build_opt test "$@"
    if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    case "$1" in
      --no-setup) setup=0; shift ;;
      --no-build) build=0; shift ;;
      -h | --help) usage_test; return 0 ;;
      --) shift; ctest_args+=("$@"); break ;;
      *) ctest_args+=("$1"); shift ;;
    esac
  done
  [[ $setup -eq 0 ]] || do_setup 0 0
  [[ $build -eq 0 ]] || do_build
  local dir junit
  dir=$(build_dir)
  [[ -f "$dir/CTestTestfile.cmake" ]] || die "test: $(show "$dir") is not configured; run '$PROG build'"
  junit=$REPORTS/ctest-junit.xml
  mkdir -p "$REPORTS"
  rm -f "$junit"
  export GTEST_COLOR=${GTEST_COLOR:-no}
  # The tests' temporary files (tests/support/temp_dir.hpp) go to one fresh folder, which must
  # be empty again when ctest ends: a test that leaves files behind fails the run.
  local tmp
  tmp=$(cd "$dir" && pwd)/test-tmp
  { rm -rf "$tmp" && mkdir -p "$tmp"; } || die "test: cannot make $(show "$tmp")"
  export MESHTEST_TMPDIR=$tmp
  local -a cmd=(ctest --test-dir "$dir" --output-on-failure -j"$JOBS" --output-junit "$junit"
    ${ctest_args[@]+"${ctest_args[@]}"})
  say "testing (ctest --test-dir $(show "$dir") --output-on-failure -j$JOBS" \
    "--output-junit $(show "$junit")${ctest_args[*]:+ ${ctest_args[*]}})"
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
  return "$rc"
}
