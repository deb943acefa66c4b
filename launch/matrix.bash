# matrix.bash — `meshtest matrix`: each MPI test binary at each rank count, every run under a
# timeout; one table test x np -> pass / fail / skip with seconds, each run's log and gtest
# XML, and a JUnit file in reports/. Sourced by launch/meshtest.

usage_matrix() {
  cat <<EOF
Usage: $PROG matrix [options] [BINARY...]

Runs each MPI test binary (default: every build/mpi_tests/test_*) at each rank
count, each run under a timeout, and prints one table test x np ->
pass / fail / skip with seconds. skip = every test of the run skipped; fail =
non-zero exit or timeout. Writes
  reports/matrix/<bin>.np<N>.log   the run's output
  reports/matrix/<bin>.np<N>.xml   gtest XML (--gtest_output, given to rank 0)
  reports/matrix/<bin>.np<N>/logs/rank<r>.log   the harness's per-rank logs
  reports/matrix-junit.xml         one <testcase> per binary x np
and exits 1 if any run failed.

  --np "LIST"       rank counts, any list, separated by spaces or commas
                    (default: "1 2 3 4 8"; the scale runs of ctest: "6 12 16 32");
                    counts above the cores run oversubscribed
  --timeout S       per-run timeout in seconds (default: 300)
  --hosts N         spread each run over the first N simulated hosts of
                    '$PROG hosts up' (docs/multi-node.md)
  --map-by node|slot  with --hosts: round robin over the hosts (default) or
                    filling one host first
  --no-build        do not build first
$(build_options_help)
EOF
}

# matrix_status <rc> <xml> <log>: pass, fail or skip.
matrix_status() {
  local rc=$1 xml=$2 log=$3 run skipped
  if [[ $rc -ne 0 ]]; then echo fail; return; fi
  if [[ -s "$xml" ]]; then
    run=$(grep -c '<testcase [^>]*status="run"' "$xml" || true)
    skipped=$(grep -c '<testcase [^>]*result="skipped"' "$xml" || true)
    if [[ $run -gt 0 && $run -eq $skipped ]]; then echo skip; else echo pass; fi
    return
  fi
  # No XML (the binary is not a gtest?): read gtest's closing lines instead.
  if grep -q '\[  PASSED  \] 0 tests' "$log" && grep -q '\[  SKIPPED \] [0-9]' "$log"; then
    echo skip
  else
    echo pass
  fi
}

# matrix_options "$@": the command line into cmd_matrix's nps, timeout, build, hosts, map and
# bins (help=1 and nothing more read at -h / --help).
matrix_options() {
  while [[ $# -gt 0 ]]; do
    build_opt matrix "$@"
    if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    case "$1" in
      --np) need_value matrix "$@"; nps=$2; shift 2 ;;
      --np=*) nps=${1#--np=}; shift ;;
      --timeout) need_value matrix "$@"; timeout=$2; shift 2 ;;
      --timeout=*) timeout=${1#--timeout=}; shift ;;
      --no-build) build=0; shift ;;
      --hosts) need_value matrix "$@"; hosts=$2; shift 2 ;;
      --hosts=*) hosts=${1#--hosts=}; shift ;;
      --map-by) need_value matrix "$@"; map=$2; shift 2 ;;
      --map-by=*) map=${1#--map-by=}; shift ;;
      -h | --help) help=1; return 0 ;;
      --) shift; bins+=("$@"); break ;;
      -*) usage_error matrix "unknown option '$1'" ;;
      *) bins+=("$1"); shift ;;
    esac
  done
}

# matrix_check_options: cmd_matrix's options checked (a usage error, exit 2, names the bad
# one); nps becomes the list of distinct counts in the order given, timeout a number, hosts
# the simulated hosts to use (empty: none).
matrix_check_options() {
  # Any list of rank counts, separated by spaces or commas; a repeated count runs once.
  local np list=""
  local -a given
  read -ra given <<<"${nps//,/ }"
  for np in ${given[@]+"${given[@]}"}; do
    is_posint "$np" || usage_error matrix "--np: '$np' is not a positive integer"
    np=$((10#$np))
    [[ " $list " == *" $np "* ]] || list+="${list:+ }$np"
  done
  [[ -n "$list" ]] || usage_error matrix "--np needs at least one rank count"
  nps=$list
  is_posint "$timeout" || usage_error matrix "--timeout needs seconds, not '$timeout'"
  timeout=$((10#$timeout))
  [[ -z "$map" || -n "$hosts" ]] || usage_error matrix "--map-by goes with --hosts"
  hosts_options matrix "$hosts" "$map"
  hosts=$HOSTS_WANT
}

# matrix_binaries: cmd_matrix's paths: the binaries named on the command line (bins), else
# every MPI test binary of the build (<build>/mpi_tests/test_*).
matrix_binaries() {
  local dir b p
  dir=$(build_dir)
  if [[ ${#bins[@]} -eq 0 ]]; then
    [[ -d "$dir/mpi_tests" ]] || die "matrix: no $(show "$dir")/mpi_tests; run '$PROG build'"
    mapfile -t paths < <(find "$dir/mpi_tests" -maxdepth 1 -type f -name 'test_*' -perm -u+x | sort)
    [[ ${#paths[@]} -gt 0 ]] || die "matrix: no MPI test binaries (test_*) in $(show "$dir")/mpi_tests"
  else
    for b in "${bins[@]}"; do
      p=$(resolve_binary "$b") || die "matrix: no such binary '$b'"
      paths+=("$p")
    done
  fi
}

# matrix_run <path> <np>: one run, the n-th of cmd_matrix's runs. Writes its log, rank 0's
# gtest XML and the harness's per-rank logs under out; adds its cell of the table (cells) and
# its JUnit test case (junit_cases), and counts it (total, passed, failed, skipped).
matrix_run() {
  local path=$1 np=$2 name
  name=$(basename "$path")
  local xml="$out/$name.np$np.xml" log="$out/$name.np$np.log" rc=0 start secs status why=""
  rm -rf "$xml" "$log" "$out/$name.np$np"
  local -a cmd=(mpirun -np 1)
  mapfile -t -O 3 cmd < <(mpirun_flags "$np" "$([[ -n "$hosts" ]] && echo 1 || echo 0)")
  [[ -z "$hosts" ]] || mapfile -t -O "${#cmd[@]}" cmd < <(hosts_mpirun_flags "$hosts" "$np" "${map:-node}")
  local -a flags=("${cmd[@]:3}")
  # MPMD: rank 0 alone writes the gtest XML (every rank writing one file would race).
  cmd+=(--tag-output "$path" "--gtest_output=xml:$xml")
  if [[ $np -gt 1 ]]; then cmd+=(: -np "$((np - 1))" "$path"); fi
  start=$(now)
  # The harness's per-rank logs: reports/matrix/<bin>.np<N>/logs/rank<r>.log.
  MESHTEST_REPORTS_DIR="$out/$name.np$np" timeout -k 10 "$timeout" "${cmd[@]}" </dev/null \
    >"$log" 2>&1 || rc=$?
  secs=$(seconds_since "$start")
  status=$(matrix_status "$rc" "$xml" "$log")
  case "$rc" in
    0) ;;
    124 | 137) why="timeout after ${timeout}s" ;;
    *) why="exit status $rc" ;;
  esac
  total=$((total + 1))
  case "$status" in
    pass) passed=$((passed + 1)) ;;
    fail) failed=$((failed + 1)) ;;
    skip) skipped=$((skipped + 1)) ;;
  esac
  cells+=("$(printf '%s %5.1fs' "$status" "$secs")")  # "pass   0.6s"
  say "[$n/$runs] $name np=$np: $status (${secs}s)${why:+ — $why}"
  if [[ $status == fail ]]; then
    echo "    mpirun -np $np${flags[*]:+ ${flags[*]}} $(show "$path")  (last lines of $(show "$log")):"
    tail -n 25 "$log" | sed 's/^/    | /'
  fi
  local tc
  tc="    <testcase classname=\"$name\" name=\"$name.np$np\" time=\"$secs\">"
  if [[ $status == fail ]]; then
    tc+=$'\n'"      <failure message=\"$why\" type=\"$([[ $rc -eq 124 || $rc -eq 137 ]] && echo timeout || echo exit)\">"
    tc+="$(tail -n 60 "$log" | xml_escape)</failure>"
  elif [[ $status == skip ]]; then
    tc+=$'\n'"      <skipped message=\"every test skipped at np $np\"/>"
  fi
  tc+=$'\n'"      <system-out>log: $(xml_escape <<<"$log")</system-out>"
  tc+=$'\n'"    </testcase>"
  junit_cases+=("$tc")
}

# matrix_table: cmd_matrix's summary, the table test x np of names, nps and cells.
matrix_table() {
  local w=4 col=11 i=0 name np
  for name in "${names[@]}"; do [[ ${#name} -gt $w ]] && w=${#name}; done
  echo
  say "matrix summary (pass / fail / skip, seconds)"
  {
    printf "%-${w}s" test
    for np in $nps; do printf "  %-${col}s" "np=$np"; done
    echo
    for name in "${names[@]}"; do
      printf "%-${w}s" "$name"
      for np in $nps; do
        printf "  %-${col}s" "${cells[$i]}"
        i=$((i + 1))
      done
      echo
    done
  } | sed 's/ *$//'
  echo
}

# matrix_junit <file> <wall seconds>: cmd_matrix's JUnit file: one test case per run
# (junit_cases) and the counts.
matrix_junit() {
  local junit=$1 wall=$2
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites name=\"meshtest matrix\" tests=\"$total\" failures=\"$failed\" errors=\"0\" skipped=\"$skipped\" time=\"$wall\">"
    echo "  <testsuite name=\"matrix\" tests=\"$total\" failures=\"$failed\" errors=\"0\" skipped=\"$skipped\"" \
      "time=\"$wall\" timestamp=\"$(date -u +%Y-%m-%dT%H:%M:%S)\" hostname=\"$(hostname 2>/dev/null | xml_escape)\">"
    printf '%s\n' "${junit_cases[@]}"
    echo "  </testsuite>"
    echo "</testsuites>"
  } >"$junit"
}

cmd_matrix() {
  local nps="1 2 3 4 8" timeout=300 build=1 hosts="" map="" help=0
  local -a bins=() paths=()
  matrix_options "$@"
  if [[ $help -eq 1 ]]; then usage_matrix; return 0; fi
  matrix_check_options
  command -v mpirun >/dev/null || die "mpirun not found: run '$PROG setup' (package openmpi-bin)"
  [[ $build -eq 0 ]] || do_build
  matrix_binaries

  local out=$REPORTS/matrix
  mkdir -p "$out"
  allow_root_env
  export GTEST_COLOR=no
  cd "$ROOT"
  local -a names=() cells=() junit_cases=()
  local total=0 passed=0 failed=0 skipped=0 n=0 runs start_all path np
  runs=$((${#paths[@]} * $(echo "$nps" | wc -w)))
  start_all=$(now)
  say "matrix: ${#paths[@]} binaries x np {$nps} = $runs runs, timeout ${timeout}s each; logs in $(show "$out")"
  for path in "${paths[@]}"; do
    names+=("$(basename "$path")")
    for np in $nps; do
      n=$((n + 1))
      matrix_run "$path" "$np"
    done
  done
  local wall
  wall=$(seconds_since "$start_all")
  matrix_table
  local junit=$REPORTS/matrix-junit.xml
  matrix_junit "$junit" "$wall"
  say "JUnit: $(show "$junit"); per-run logs and gtest XML: $(show "$out")"
  echo "matrix: $passed passed, $failed failed, $skipped skipped ($total runs, $(hms "$wall"))"
  [[ $failed -eq 0 ]]
}
