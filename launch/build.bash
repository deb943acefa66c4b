# build.bash — `meshtest build`, and the build options (--sanitize, --native, --debug,
# --cuda, --no-cuda, --build-dir, --clean, -D...) that demo, test, matrix, bench and fuzz take too: the build
# directory they name, configure and build. Sourced by launch/meshtest.

build_options_help() {
  cat <<EOF
  --sanitize        ASan + UBSan build (-DMESHTEST_SANITIZE=ON, RelWithDebInfo)
                    in build-asan (or \$MESHTEST_BUILD_DIR-asan)
  --native          for this machine's processor (-DMESHTEST_NATIVE=ON: -march=native,
                    Eigen's GEMMs with AVX2 / AVX-512) in build-native: for benchmarks
  --debug           Debug build in build-debug (or \$MESHTEST_BUILD_DIR-debug)
  --cuda            build the GPU side (-DMESHTEST_CUDA=ON): a configure error names what
                    is missing of the CUDA toolkit and NCCL
  --no-cuda         CPU ranks only (-DMESHTEST_CUDA=OFF). Without either: what the build
                    directory was configured with, at first AUTO (the GPU side when the
                    CUDA toolkit and NCCL are found)
  --build-dir DIR   build directory to use as is (overrides the three above's naming)
  --clean           delete the build directory first
  -DVAR=VALUE       passed to cmake at configure time
EOF
}

usage_build() {
  cat <<EOF
Usage: $PROG build [options]

Configures (cmake -S <repo> -B build -DCMAKE_BUILD_TYPE=Release; a new build
directory with -G Ninja where ninja is installed and CMAKE_GENERATOR is unset) and
builds (cmake --build build -j\$MESHTEST_JOBS). Binaries go to build/bin, unit tests
to build/tests, MPI tests to build/mpi_tests.

$(build_options_help)
EOF
}

# Build options shared by build, demo, test, matrix, bench. build_opt "$@" sets
# CONSUMED to how many arguments it took (0: not a build option).
OPT_SANITIZE=0
OPT_NATIVE=0
OPT_DEBUG=0
OPT_CLEAN=0
OPT_CUDA=""
OPT_BUILD_DIR=""
OPT_CMAKE_ARGS=()
CONSUMED=0
build_opt() {
  local sub=$1
  shift
  CONSUMED=1
  case "$1" in
    --sanitize) OPT_SANITIZE=1 ;;
    --native) OPT_NATIVE=1 ;;
    --debug) OPT_DEBUG=1 ;;
    --clean) OPT_CLEAN=1 ;;
    --cuda | --no-cuda)
      local want=ON
      [[ "$1" == --cuda ]] || want=OFF
      [[ -z "$OPT_CUDA" || "$OPT_CUDA" == "$want" ]] ||
        usage_error "$sub" "--cuda and --no-cuda contradict each other: give one"
      OPT_CUDA=$want ;;
    --build-dir) need_value "$sub" "$@"; OPT_BUILD_DIR=$2; CONSUMED=2 ;;
    --build-dir=*) OPT_BUILD_DIR=${1#--build-dir=} ;;
    -D?*) OPT_CMAKE_ARGS+=("$1") ;;
    *) CONSUMED=0 ;;
  esac
}

build_dir() {
  if [[ -n "$OPT_BUILD_DIR" ]]; then
    abspath "$OPT_BUILD_DIR"
    return
  fi
  local dir=${MESHTEST_BUILD_DIR:-$ROOT/build}
  [[ $OPT_SANITIZE -eq 1 ]] && dir+=-asan
  [[ $OPT_NATIVE -eq 1 ]] && dir+=-native
  [[ $OPT_DEBUG -eq 1 ]] && dir+=-debug
  abspath "$dir"
}

do_build() {
  local dir type sanitize=OFF native=OFF start
  dir=$(build_dir)
  type=Release
  [[ $OPT_SANITIZE -eq 1 ]] && { sanitize=ON; type=RelWithDebInfo; }
  [[ $OPT_DEBUG -eq 1 ]] && type=Debug
  [[ $OPT_NATIVE -eq 1 ]] && native=ON
  if command -v dpkg-query >/dev/null && [[ -r "$PACKAGES_FILE" ]]; then
    local missing
    missing=$(missing_packages 0 | tr '\n' ' ')
    [[ -z "$missing" ]] || warn "Debian packages missing: $missing— run '$PROG setup'"
  fi
  if [[ $OPT_CLEAN -eq 1 && -d "$dir" ]]; then
    [[ -f "$dir/CMakeCache.txt" || -z "$(ls -A "$dir")" ]] ||
      die "--clean: $dir does not look like a build directory (no CMakeCache.txt); not deleting it"
    say "cleaning ($(show "$dir"))"
    rm -rf "$dir"
  fi
  start=$(now)
  # A new build directory gets Ninja where it is installed (and CMAKE_GENERATOR names none): on
  # 2 cores a fresh build took 501 s with Ninja, about 560 s with CMake's Makefiles (their
  # recursive make and per-target dependency steps). An existing one keeps its generator.
  local -a generator=()
  if [[ ! -f "$dir/CMakeCache.txt" && -z "${CMAKE_GENERATOR:-}" ]] && command -v ninja >/dev/null
  then
    generator=(-G Ninja)
  fi
  local -a configure=(cmake -S "$ROOT" -B "$dir" ${generator[@]+"${generator[@]}"}
    -DCMAKE_BUILD_TYPE="$type"
    -DMESHTEST_SANITIZE="$sanitize" -DMESHTEST_NATIVE="$native"
    ${OPT_CUDA:+-DMESHTEST_CUDA="$OPT_CUDA"} ${OPT_CMAKE_ARGS[@]+"${OPT_CMAKE_ARGS[@]}"})
  say "configuring (cmake -S $(show "$ROOT") -B $(show "$dir")${generator[*]:+ ${generator[*]}} -DCMAKE_BUILD_TYPE=$type" \
    "-DMESHTEST_SANITIZE=$sanitize -DMESHTEST_NATIVE=$native${OPT_CUDA:+ -DMESHTEST_CUDA=$OPT_CUDA}${OPT_CMAKE_ARGS[*]:+ ${OPT_CMAKE_ARGS[*]}})"
  "${configure[@]}"
  say "building (cmake --build $(show "$dir") -j$JOBS${1:+ --target $1})"
  cmake --build "$dir" -j"$JOBS" ${1:+--target "$1"}
  say "built in $(hms "$(seconds_since "$start")"): $(show "$dir")/{bin,tests,mpi_tests}"
}

cmd_build() {
  while [[ $# -gt 0 ]]; do
    build_opt build "$@"
    if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    case "$1" in
      -h | --help) usage_build; return 0 ;;
      *) usage_error build "unknown option '$1'" ;;
    esac
  done
  do_build
}
