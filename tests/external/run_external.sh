#!/usr/bin/env bash
# run_external.sh — checks that projects outside meshtest build against it and pass, and that
# the harness ends a failing MPI job. Phases (CTest runs each as a test, label "external"):
#   package        cmake --install the build tree into <work>/prefix; build
#                  examples/row_parallel_linear against that (-DCMAKE_PREFIX_PATH) and
#                  docs/examples/external_test against the build tree (-Dmeshtest_DIR);
#   package-test   ctest of the example built by `package` (np 1 2 3 4);
#   subdir         build examples/row_parallel_linear with meshtest's sources added by
#                  add_subdirectory (-DMESHTEST_SOURCE_DIR=<repo>: only meshtest's libraries
#                  compile, at -O0, as a unity build and with clang++ where there is one: the
#                  plumbing is under test, not the optimizer);
#   subdir-test    ctest of the example built by `subdir`;
#   rank-failure   run docs/examples/external_test at np 4 under mpirun (60 s timeout) and
#                  assert: non-zero exit, done within 30 s, output names "[rank 1/4]";
#   bad-component  find_package(meshtest COMPONENTS nosuch) must fail at configure, naming
#                  "nosuch" and the components there are;
#   gpu-component  tests/external/gpu_component (on meshtest::dist_gpu) against the build
#                  tree: built with the GPU side, it builds and runs (no GPU is fine);
#                  without, asking for gpu fails naming it;
#   gpu-example    examples/row_parallel_linear_gpu (its own CUDA kernel, on meshtest::dist_gpu)
#                  against the install of `package`, with meshtest's CUDA compiler and
#                  architectures, no build type (-O0: the fastest compile); needs the GPU side;
#   gpu-example-test  its ctest (np 1 2 4; every test skipped, with the reason, without GPUs);
#   all            every phase, in this order (the gpu-example ones only with the GPU side).
# No C++ standard is set by the examples: the meshtest targets carry C++20 (a .cu is C++17).
# Usage: run_external.sh [--build-dir DIR] [--work DIR] [--mpiexec PATH] [--phase PHASE]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
example="$root/examples/row_parallel_linear"
gpu_example="$root/examples/row_parallel_linear_gpu"
rank_failure="$root/docs/examples/external_test"
build_dir="${MESHTEST_BUILD_DIR:-$root/build}"
work=""
mpiexec="${MPIEXEC:-mpirun}"
phase=all
np=4
run_timeout=60   # the job is killed after this
max_seconds=30   # ...but it must end on its own within this
phases=(package package-test subdir subdir-test rank-failure bad-component gpu-component
        gpu-example gpu-example-test)

usage() { sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
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
if [[ "$phase" == all ]]; then
  run_phases=("${phases[@]}")
  [[ -f "$build_dir/meshtestGpuTargets.cmake" ]] || run_phases=("${phases[@]:0:7}")
elif [[ " ${phases[*]} " == *" $phase "* ]]; then
  run_phases=("$phase")
else
  die "--phase must be one of: ${phases[*]} all; not '$phase'"
fi
[[ "$build_dir" = /* ]] || build_dir="$root/$build_dir"
[[ -f "$build_dir/meshtestConfig.cmake" ]] ||
  die "no meshtestConfig.cmake in $build_dir: build meshtest first (./launch/meshtest build)"
if [[ -z "$work" ]]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/meshtest-external.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)

# Build the examples with the generator, compiler, build type and sanitizer of meshtest's build.
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt"; }
cmake_args=(-G "$(cache_value CMAKE_GENERATOR)"
            -DCMAKE_CXX_COMPILER="$(cache_value CMAKE_CXX_COMPILER)")
build_type=$(cache_value CMAKE_BUILD_TYPE)
if [[ "$(cache_value MESHTEST_SANITIZE)" == ON ]]; then
  # MESHTEST_SANITIZE: meshtest_add_mpi_test gives the tests the LeakSanitizer suppressions of
  # the MPI runtime (lsan.supp, installed with the package); under add_subdirectory it also
  # instruments meshtest's own sources.
  cmake_args+=("-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-omit-frame-pointer"
               "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" -DMESHTEST_SANITIZE=ON)
fi
jobs=$(nproc 2>/dev/null || echo 2)

step() { echo "==> $*"; }
# run_logged <log> <what failed> <command...>: the command's output goes to the log, shown on failure.
run_logged() {
  local log=$1 what=$2
  shift 2
  "$@" >>"$log" 2>&1 || { cat "$log"; die "$what failed (log: $log)"; }
}
# build_example <source> <build dir> <cmake args...>: configure and build a project.
build_example() {
  local src=$1 dir=$2
  shift 2
  rm -rf "$dir" "$dir.log"
  run_logged "$dir.log" "configure of $src" cmake -S "$src" -B "$dir" "${cmake_args[@]}" "$@"
  run_logged "$dir.log" "build of $src" cmake --build "$dir" -j"$jobs"
}
# no_warnings <build dir>: a build against the package compiles only the consumer's code and
# meshtest's headers: a compiler warning there is one every consumer would see.
no_warnings() {
  if grep -q "warning:" "$1.log"; then
    grep "warning:" "$1.log"
    die "the build in $1 gave compiler warnings (log: $1.log)"
  fi
}
# ctest_example <build dir>: the project's own tests, one at a time.
ctest_example() {
  [[ -f "$1/CTestTestfile.cmake" ]] || die "$1 is not built: run its build phase first (same --work)"
  step "ctest --test-dir $1"
  ctest --test-dir "$1" --output-on-failure -j1
}

phase_package() {
  step "cmake --install $build_dir --prefix $work/prefix"
  rm -rf "$work/prefix" "$work/install.log"
  run_logged "$work/install.log" "cmake --install" cmake --install "$build_dir" --prefix "$work/prefix"
  step "examples/row_parallel_linear against the install ($work/prefix)"
  build_example "$example" "$work/package" -DCMAKE_PREFIX_PATH="$work/prefix" \
    ${build_type:+-DCMAKE_BUILD_TYPE="$build_type"}
  grep -q "^meshtest_DIR:PATH=$work/prefix/" "$work/package/CMakeCache.txt" ||
    die "the example did not find meshtest in $work/prefix: $(grep '^meshtest_DIR' "$work/package/CMakeCache.txt")"
  no_warnings "$work/package"
  echo "    ok: $work/package/test_row_parallel_linear"
  step "docs/examples/external_test against the build tree ($build_dir)"
  build_example "$rank_failure" "$work/tree" -Dmeshtest_DIR="$build_dir" \
    ${build_type:+-DCMAKE_BUILD_TYPE="$build_type"}
  no_warnings "$work/tree"
  echo "    ok: $work/tree/test_rank_failure"
}

phase_subdir() {
  # No build type: -O0 without -g compiles meshtest's libraries fastest; a unity build of 40
  # sources a batch (the core library in two, so that both cores compile: 82 s against 105 s of
  # wall time for one batch, 10 % more CPU) instantiates Eigen's templates once or twice per
  # library, and then precompiled headers only cost. The GPU side off: the example is a CPU one, and enabling CUDA costs the
  # compiler checks. With clang++ where there is one (and no sanitizer: clang's runtime is
  # another package): a consumer whose compiler is not meshtest's build's, in half GCC's time
  # (110 s against 213 s of compile on 2 cores).
  local -a compiler=()
  if [[ "$(cache_value MESHTEST_SANITIZE)" != ON ]] && command -v clang++ >/dev/null; then
    compiler=(-DCMAKE_CXX_COMPILER="$(command -v clang++)")
  fi
  step "examples/row_parallel_linear with add_subdirectory($root)" \
    "(${compiler[0]:-the compiler of $build_dir})"
  build_example "$example" "$work/subdir" -DMESHTEST_SOURCE_DIR="$root" -DCMAKE_BUILD_TYPE= \
    -DCMAKE_UNITY_BUILD=ON -DMESHTEST_UNITY_BATCH_SIZE=40 -DMESHTEST_PCH=OFF -DMESHTEST_CUDA=OFF \
    ${compiler[@]+"${compiler[@]}"}
  local t
  for t in meshtest-demo test_ccl meshtest-bench; do  # the parent gets meshtest's libraries only
    [[ ! -e "$work/subdir/meshtest/bin/$t" && ! -e "$work/subdir/meshtest/mpi_tests/$t" ]] ||
      die "add_subdirectory built meshtest's $t: its tests, benches and tools must be off"
  done
  echo "    ok: $work/subdir/test_row_parallel_linear"
}

phase_rank_failure() {
  local exe="$work/tree/test_rank_failure"
  [[ -x "$exe" ]] || die "$exe is missing: run the package phase first (same --work)"
  local flags=(-np "$np" --oversubscribe)
  if [[ $EUID -eq 0 ]]; then flags+=(--allow-run-as-root); fi
  step "timeout $run_timeout $mpiexec ${flags[*]} $exe"
  local start=$EPOCHREALTIME rc=0
  GTEST_COLOR=no timeout -k 5 "$run_timeout" "$mpiexec" "${flags[@]}" "$exe" \
    </dev/null >"$work/run.log" 2>&1 || rc=$?
  local seconds
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  sed 's/^/    | /' "$work/run.log" | tail -n 40
  local failed=0
  check() {  # check <ok 0|1> <message>
    if [[ "$1" == 1 ]]; then echo "    pass: $2"; else echo "    FAIL: $2"; failed=1; fi
  }
  check "$([[ $rc -ne 0 ]] && echo 1 || echo 0)" "non-zero exit (got $rc)"
  check "$([[ $rc -ne 124 && $rc -ne 137 ]] && echo 1 || echo 0)" "not killed by the $run_timeout s timeout"
  check "$(awk -v s="$seconds" -v m="$max_seconds" 'BEGIN { print (s < m) ? 1 : 0 }')" \
    "ended within $max_seconds s (took $seconds s)"
  check "$(grep -qF "[rank 1/$np]" "$work/run.log" && echo 1 || echo 0)" "output names [rank 1/$np]"
  [[ $failed -eq 0 ]] || exit 1
}

phase_bad_component() {
  local dir="$work/bad-component" rc=0
  step "find_package(meshtest REQUIRED COMPONENTS core nosuch) must fail at configure"
  rm -rf "$dir"
  cmake -S "$here/bad_component" -B "$dir" -Dmeshtest_DIR="$build_dir" >"$dir.log" 2>&1 || rc=$?
  sed 's/^/    | /' "$dir.log" | grep -v '^    | *$' | tail -n 12
  [[ $rc -ne 0 ]] || die "configure succeeded: asking for component 'nosuch' must fail"
  local components="core, meshtest, gtest_main, fused_kit"
  [[ ! -f "$build_dir/meshtestGpuTargets.cmake" ]] || components+=", gpu"
  local want="meshtest has no component \"nosuch\" (its components are: $components)"
  # CMake wraps the message; compare it with the line breaks and indentation taken out.
  tr -s ' \n' ' ' <"$dir.log" | grep -qF "$want" || die "the configure error does not say: $want"
  echo "    pass: configure failed (exit $rc) with: $want"
}

phase_gpu_component() {
  local dir="$work/gpu-component" rc=0
  if [[ -f "$build_dir/meshtestGpuTargets.cmake" ]]; then
    step "find_package(meshtest COMPONENTS gpu): a program on meshtest::dist_gpu builds and runs"
    build_example "$here/gpu_component" "$dir" -Dmeshtest_DIR="$build_dir" \
      ${build_type:+-DCMAKE_BUILD_TYPE="$build_type"}
    no_warnings "$dir"
    "$dir/gpu_devices" || die "$dir/gpu_devices failed (exit $?)"
    echo "    ok: $dir/gpu_devices"
    return
  fi
  step "find_package(meshtest COMPONENTS gpu) must fail: meshtest was built without its GPU side"
  rm -rf "$dir"
  cmake -S "$here/gpu_component" -B "$dir" -Dmeshtest_DIR="$build_dir" >"$dir.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || die "configure succeeded: component gpu must be missing from this build"
  local want='meshtest has no component "gpu"'
  tr -s ' \n' ' ' <"$dir.log" | grep -qF "$want" || { cat "$dir.log"; die "the configure error does not say: $want"; }
  echo "    pass: configure failed (exit $rc) with: $want"
}

phase_gpu_example() {
  [[ -f "$build_dir/meshtestGpuTargets.cmake" ]] ||
    die "meshtest in $build_dir was built without its GPU side: no gpu-example"
  [[ -d "$work/prefix" ]] || die "$work/prefix is missing: run the package phase first (same --work)"
  step "examples/row_parallel_linear_gpu against the install ($work/prefix), component gpu"
  local cuda_args=() v
  for v in CMAKE_CUDA_COMPILER CMAKE_CUDA_HOST_COMPILER CMAKE_CUDA_ARCHITECTURES; do
    [[ -z "$(cache_value "$v")" ]] || cuda_args+=("-D$v=$(cache_value "$v")")
  done
  # No build type: only the example's three files compile, and its host code compiles fastest
  # at -O0 (ptxas optimizes the kernel's device code whatever the host flags).
  build_example "$gpu_example" "$work/gpu-example" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCMAKE_BUILD_TYPE= "${cuda_args[@]}"
  grep -q "^meshtest_DIR:PATH=$work/prefix/" "$work/gpu-example/CMakeCache.txt" ||
    die "the GPU example did not find meshtest in $work/prefix: $(grep '^meshtest_DIR' "$work/gpu-example/CMakeCache.txt")"
  no_warnings "$work/gpu-example"
  echo "    ok: $work/gpu-example/test_row_parallel_linear_gpu"
}

for p in "${run_phases[@]}"; do
  case "$p" in
    package) phase_package ;;
    package-test) ctest_example "$work/package" ;;
    subdir) phase_subdir ;;
    subdir-test) ctest_example "$work/subdir" ;;
    rank-failure) phase_rank_failure ;;
    bad-component) phase_bad_component ;;
    gpu-component) phase_gpu_component ;;
    gpu-example) phase_gpu_example ;;
    gpu-example-test) ctest_example "$work/gpu-example" ;;
  esac
done
echo "run_external: ok ($phase)"
