# fuzz.bash — `meshtest fuzz`: the libFuzzer targets of tests/fuzz, built with clang
# (ASan + UBSan) in build-fuzz and run for a time each, one after another or in parallel;
# a crash's input kept in tests/fuzz/regressions. Sourced by launch/meshtest.

usage_fuzz() {
  cat <<EOF
Usage: $PROG fuzz [TARGET...] [--seconds N] [options] [-- LIBFUZZER_ARGS...]

Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan, coverage) in
build-fuzz (or \$MESHTEST_BUILD_DIR-fuzz), installing clang with apt-get when it
is missing (as setup does), then runs each TARGET (default: all) for N seconds:
  build-fuzz/fuzz/fuzz_<target> -max_total_time=N -max_len=65536 -rss_limit_mb=2048
      -timeout=25 build-fuzz/fuzz-work/<target>/corpus tests/fuzz/corpus/<target>
      [tests/fuzz/regressions/<target>]
New inputs go to the scratch corpus under build-fuzz; the seed corpus is only read.
Prints per target execs/s, cov and ft (libFuzzer's coverage counters), the corpus
size and the crashes found. A crash's input is copied to
tests/fuzz/regressions/<target>/ (commit it with the fix: ctest -L fuzz replays
it); exit 1 if any target crashed. See docs/fuzzing.md.

Targets (tests/fuzz/<target>.cpp): $(fuzz_target_names)

  --seconds N       time per target (default: 60)
  --max-len N       the largest input libFuzzer makes, in bytes (default: 65536)
  --parallel N      run N targets at once, a core each (default: 1, one after another)
  --no-build        run the targets already built
  --build-dir DIR   build directory (default: build-fuzz)
  --clean           delete the build directory first
  -DVAR=VALUE       passed to cmake at configure time
  -- ARGS           passed to every libFuzzer run (e.g. -- -use_value_profile=1)
EOF
}

# The fuzz targets: the list in tests/fuzz/CMakeLists.txt.
fuzz_target_names() {
  sed -n 's/^set(MESHTEST_FUZZ_TARGETS \(.*\))$/\1/p' "$ROOT/tests/fuzz/CMakeLists.txt"
}

# libfuzzer_links: whether clang++ can link a libFuzzer binary.
libfuzzer_links() {
  local dir rc=0
  dir=$(mktemp -d)
  printf '%s\n' 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$dir/t.cpp"
  clang++ -fsanitize=fuzzer "$dir/t.cpp" -o "$dir/t" >/dev/null 2>&1 || rc=1
  rm -rf "$dir"
  return "$rc"
}

# need_libfuzzer: clang++ and libFuzzer, installed with apt-get when missing (as setup does).
need_libfuzzer() {
  if ! command -v clang++ >/dev/null; then
    say "fuzz: clang++ not found; it builds the libFuzzer targets"
    apt_install clang
  fi
  if ! libfuzzer_links; then
    say "fuzz: clang++ cannot link libFuzzer (-fsanitize=fuzzer); it is in libclang-rt-dev"
    apt_install libclang-rt-dev
    libfuzzer_links || die "fuzz: clang++ still cannot link a -fsanitize=fuzzer program"
  fi
}

# fuzz_stat <log> <key>: the number after "<key>: " on libFuzzer's last status line.
fuzz_stat() {
  awk -v key="$2:" '/ cov: / { line = $0 }
    END { n = split(line, f, " "); for (i = 1; i < n; i++) if (f[i] == key) { print f[i + 1]; exit } }' "$1"
}

cmd_fuzz() {
  local seconds=60 max_len=65536 build=1 dir parallel=1
  local -a targets=() extra=() all
  read -ra all <<<"$(fuzz_target_names)"
  [[ ${#all[@]} -gt 0 ]] || die "fuzz: no MESHTEST_FUZZ_TARGETS in tests/fuzz/CMakeLists.txt"
  while [[ $# -gt 0 ]]; do
    build_opt fuzz "$@"
    if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    case "$1" in
      --seconds) need_value fuzz "$@"; seconds=$2; shift 2 ;;
      --seconds=*) seconds=${1#--seconds=}; shift ;;
      --max-len) need_value fuzz "$@"; max_len=$2; shift 2 ;;
      --max-len=*) max_len=${1#--max-len=}; shift ;;
      --parallel) need_value fuzz "$@"; parallel=$2; shift 2 ;;
      --parallel=*) parallel=${1#--parallel=}; shift ;;
      --no-build) build=0; shift ;;
      -h | --help) usage_fuzz; return 0 ;;
      --) shift; extra+=("$@"); break ;;
      -*) usage_error fuzz "unknown option '$1' (libFuzzer's own options go after --)" ;;
      *)
        [[ " ${all[*]} " == *" $1 "* ]] ||
          usage_error fuzz "unknown target '$1' (the targets: ${all[*]})"
        targets+=("$1"); shift ;;
    esac
  done
  is_posint "$seconds" || usage_error fuzz "--seconds needs a positive integer, not '$seconds'"
  is_posint "$max_len" || usage_error fuzz "--max-len needs a positive integer, not '$max_len'"
  is_posint "$parallel" || usage_error fuzz "--parallel needs a positive integer, not '$parallel'"
  parallel=$((10#$parallel))
  seconds=$((10#$seconds))
  max_len=$((10#$max_len))
  [[ $OPT_SANITIZE -eq 0 && $OPT_DEBUG -eq 0 && $OPT_NATIVE -eq 0 ]] ||
    usage_error fuzz "--sanitize, --native and --debug do not apply: the fuzz build is always ASan + UBSan"
  [[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
  dir=${OPT_BUILD_DIR:-${MESHTEST_BUILD_DIR:-$ROOT/build}-fuzz}
  dir=$(abspath "$dir")
  if [[ $build -eq 1 ]]; then
    need_libfuzzer
    if [[ $OPT_CLEAN -eq 1 && -d "$dir" ]]; then
      [[ -f "$dir/CMakeCache.txt" ]] ||
        die "--clean: $dir does not look like a build directory (no CMakeCache.txt); not deleting it"
      say "cleaning ($(show "$dir"))"
      rm -rf "$dir"
    fi
    local -a configure=(cmake -S "$ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo
      -DCMAKE_CXX_COMPILER=clang++ -DMESHTEST_FUZZ=ON -DMESHTEST_BUILD_TESTS=OFF
      -DMESHTEST_BUILD_BENCH=OFF -DMESHTEST_BUILD_TOOLS=OFF -DMESHTEST_INSTALL=OFF
      ${OPT_CMAKE_ARGS[@]+"${OPT_CMAKE_ARGS[@]}"})
    say "configuring (${configure[*]/#$ROOT/.})"
    "${configure[@]}" >/dev/null
    say "building (cmake --build $(show "$dir") -j$JOBS --target fuzz_targets)"
    cmake --build "$dir" -j"$JOBS" --target fuzz_targets
  fi

  local t rc found=0 running=0
  local -a rows=() findings=()
  [[ $parallel -le ${#targets[@]} ]] || parallel=${#targets[@]}
  if [[ $parallel -gt 1 ]]; then
    say "fuzz: ${#targets[@]} targets, $parallel at a time, ${seconds}s each"
  fi
  for t in "${targets[@]}"; do
    [[ -x "$dir/fuzz/fuzz_$t" ]] ||
      die "fuzz: no $(show "$dir/fuzz/fuzz_$t"); build it ('$PROG fuzz' without --no-build)"
  done
  for t in "${targets[@]}"; do
    if [[ $parallel -le 1 ]]; then
      fuzz_one "$t"
      continue
    fi
    if [[ $running -ge $parallel ]]; then
      wait -n || true
      running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
  done
  wait || true
  for t in "${targets[@]}"; do
    rc=$(sed -n 1p "$dir/fuzz-work/$t/result")
    rows+=("$(sed -n 2p "$dir/fuzz-work/$t/result")")
    if [[ $rc -ne 0 ]]; then
      found=1
      mapfile -t -O "${#findings[@]}" findings < <(sed -n '3,$p' "$dir/fuzz-work/$t/result")
      if [[ $parallel -gt 1 ]]; then
        grep -m1 -A12 -E '^==[0-9]+== ?ERROR|runtime error:|invariant broken|terminate called' \
          "$dir/fuzz-work/$t/fuzz.log" | sed "s/^/    $t | /" || true
      fi
    fi
  done
  echo
  say "fuzz summary (cov, ft, corpus: libFuzzer's last status line; corpus = inputs/bytes)"
  printf '%-16s %8s %10s %7s %8s %14s %8s\n' target seconds execs/s cov ft corpus crashes
  printf '%s\n' "${rows[@]}"
  if [[ $found -eq 1 ]]; then
    echo
    say "findings, kept as regression inputs (commit them with the fix; ctest -L fuzz replays them):"
    printf '  %s\n' "${findings[@]}"
    return 1
  fi
}

# fuzz_one <target>: one libFuzzer run (the variables of cmd_fuzz: dir, seconds, max_len,
# extra). Writes $dir/fuzz-work/<target>/result: a 0/1 line (found something), the summary
# row, then a line per finding.
fuzz_one() {
  local t=$1 bin work log regress rc=0 execs cov ft corp crashes=0 a
  local -a cmd found=()
  bin=$dir/fuzz/fuzz_$t
  # libFuzzer adds the inputs it finds to its first corpus directory: a scratch copy, kept
  # between runs; the seed corpus and the regression inputs are only read.
  work=$dir/fuzz-work/$t
  log=$work/fuzz.log
  regress=$ROOT/tests/fuzz/regressions/$t
  rm -rf "$work/artifacts" "$work/result"
  mkdir -p "$work/corpus" "$work/artifacts"
  cmd=("$bin" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048
    -timeout=25 -print_final_stats=1 -artifact_prefix="$work/artifacts/"
    ${extra[@]+"${extra[@]}"} "$work/corpus" "$ROOT/tests/fuzz/corpus/$t")
  [[ -d "$regress" ]] && cmd+=("$regress")
  say "fuzz $t: ${seconds}s (log: $(show "$log"))"
  (cd "$work" && "${cmd[@]}") >"$log" 2>&1 || rc=$?
  execs=$(awk -F': *' '/^stat::average_exec_per_sec/ { v = $2 } END { print v }' "$log")
  [[ -n "$execs" ]] || execs=$(fuzz_stat "$log" exec/s)
  cov=$(fuzz_stat "$log" cov)
  ft=$(fuzz_stat "$log" ft)
  corp=$(fuzz_stat "$log" corp)
  for a in "$work"/artifacts/{crash,leak,timeout,oom}-*; do
    [[ -f "$a" ]] || continue
    crashes=$((crashes + 1))
    mkdir -p "$regress"
    cp "$a" "$regress/"
    found+=("$t: $(show "$regress/$(basename "$a")") — reproduce: $(show "$bin") $(show "$regress/$(basename "$a")")")
  done
  if [[ $crashes -eq 0 && $rc -ne 0 ]]; then
    crashes=1
    found+=("$t: libFuzzer exited $rc without an artifact; see $(show "$log")")
  fi
  if [[ $crashes -gt 0 && $parallel -le 1 ]]; then
    grep -m1 -A12 -E '^==[0-9]+== ?ERROR|runtime error:|invariant broken|terminate called' "$log" |
      sed 's/^/    | /' || true
  fi
  {
    [[ $crashes -gt 0 ]] && echo 1 || echo 0
    printf '%-16s %8s %10s %7s %8s %14s %8s\n' "$t" "$seconds" "${execs:-?}" "${cov:-?}" \
      "${ft:-?}" "${corp:-?}" "$crashes"
    [[ ${#found[@]} -eq 0 ]] || printf '%s\n' "${found[@]}"
  } >"$work/result"
  say "fuzz $t: done ($crashes found)"
}
