#!/usr/bin/env bash
# run_external.sh — checks that a test program outside the repo builds against
# the meshtest CMake package and that the harness ends a failing MPI job.
#   build: (a) configure + build docs/examples/external_test against the build
#              tree (-Dmeshtest_DIR=<build dir>);
#          (b) cmake --install the build tree into <work>/prefix and build the
#              example against that (-DCMAKE_PREFIX_PATH=<work>/prefix);
#   run:   (c) run the installed example at np 4 under mpirun (60 s timeout) and
#              assert: non-zero exit, done within 30 s, output names "[rank 1/4]".
# Usage: run_external.sh [--build-dir DIR] [--work DIR] [--mpiexec PATH]
#                        [--phase build|run|all]
# CTest runs it from tests/external/CMakeLists.txt (label "external").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
example="$root/docs/examples/external_test"
build_dir="${MESHTEST_BUILD_DIR:-$root/build}"
work=""
mpiexec="${MPIEXEC:-mpirun}"
phase=all
np=4
run_timeout=60   # the job is killed after this
max_seconds=30   # ...but it must end on its own within this

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "run_external: error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) [[ $# -ge 2 ]] || die "$1 needs a value"; build_dir=$2; shift 2 ;;
    --work) [[ $# -ge 2 ]] || die "$1 needs a value"; work=$2; shift 2 ;;
    --mpiexec) [[ $# -ge 2 ]] || die "$1 needs a value"; mpiexec=$2; shift 2 ;;
    --phase) [[ $# -ge 2 ]] || die "$1 needs a value"; phase=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
case "$phase" in build | run | all) ;; *) die "--phase must be build, run or all, not '$phase'" ;; esac
[[ "$build_dir" = /* ]] || build_dir="$root/$build_dir"
[[ -f "$build_dir/meshtestConfig.cmake" ]] ||
  die "no meshtestConfig.cmake in $build_dir: build meshtest first (./launch/meshtest build)"
if [[ -z "$work" ]]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/meshtest-external.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)

# Build the example with the compiler, build type and sanitizer flags of meshtest.
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt"; }
cmake_args=(-DCMAKE_CXX_COMPILER="$(cache_value CMAKE_CXX_COMPILER)")
build_type=$(cache_value CMAKE_BUILD_TYPE)
[[ -z "$build_type" ]] || cmake_args+=(-DCMAKE_BUILD_TYPE="$build_type")
if [[ "$(cache_value MESHTEST_SANITIZE)" == ON ]]; then
  cmake_args+=("-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer"
               "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined")
fi
jobs=$(nproc 2>/dev/null || echo 2)

step() { echo "==> $*"; }

if [[ "$phase" != run ]]; then
  step "(a) example against the build tree ($build_dir)"
  cmake -S "$example" -B "$work/tree" -Dmeshtest_DIR="$build_dir" "${cmake_args[@]}" >"$work/tree.log" 2>&1 ||
    { cat "$work/tree.log"; die "(a) configure against the build tree failed"; }
  cmake --build "$work/tree" -j"$jobs" >>"$work/tree.log" 2>&1 ||
    { cat "$work/tree.log"; die "(a) build against the build tree failed"; }
  echo "    ok: $work/tree/test_rank_failure"

  step "(b) cmake --install $build_dir --prefix $work/prefix, example against the install"
  rm -rf "$work/prefix"
  cmake --install "$build_dir" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log"; die "(b) cmake --install failed"; }
  cmake -S "$example" -B "$work/installed" -DCMAKE_PREFIX_PATH="$work/prefix" "${cmake_args[@]}" \
    >"$work/installed.log" 2>&1 || { cat "$work/installed.log"; die "(b) configure against the install failed"; }
  grep -q "$work/prefix" "$work/installed/CMakeCache.txt" ||
    die "(b) the example did not find meshtest in $work/prefix"
  cmake --build "$work/installed" -j"$jobs" >>"$work/installed.log" 2>&1 ||
    { cat "$work/installed.log"; die "(b) build against the install failed"; }
  echo "    ok: $work/installed/test_rank_failure"
fi

if [[ "$phase" != build ]]; then
  exe="$work/installed/test_rank_failure"
  [[ -x "$exe" ]] || die "$exe is missing: run the build phase first (same --work)"
  flags=(-np "$np" --oversubscribe)
  if [[ $EUID -eq 0 ]]; then flags+=(--allow-run-as-root); fi
  step "(c) timeout $run_timeout $mpiexec ${flags[*]} $exe"
  start=$EPOCHREALTIME
  rc=0
  GTEST_COLOR=no timeout -k 5 "$run_timeout" "$mpiexec" "${flags[@]}" "$exe" \
    </dev/null >"$work/run.log" 2>&1 || rc=$?
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  sed 's/^/    | /' "$work/run.log" | tail -n 40
  failed=0
  check() {  # check <ok 0|1> <message>
    if [[ "$1" == 1 ]]; then echo "    pass: $2"; else echo "    FAIL: $2"; failed=1; fi
  }
  check "$([[ $rc -ne 0 ]] && echo 1 || echo 0)" "non-zero exit (got $rc)"
  check "$([[ $rc -ne 124 && $rc -ne 137 ]] && echo 1 || echo 0)" "not killed by the $run_timeout s timeout"
  check "$(awk -v s="$seconds" -v m="$max_seconds" 'BEGIN { print (s < m) ? 1 : 0 }')" \
    "ended within $max_seconds s (took $seconds s)"
  check "$(grep -qF "[rank 1/$np]" "$work/run.log" && echo 1 || echo 0)" "output names [rank 1/$np]"
  [[ $failed -eq 0 ]] || exit 1
fi
echo "run_external: ok ($phase)"
