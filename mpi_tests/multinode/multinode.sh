#!/usr/bin/env bash
# multinode.sh — CTest's side of the multinode label: MPI tests across 2 simulated hosts
# (launch/hosts.bash), run through the entry script as a user would.
#   multinode.sh setup HOSTS            fixture: 'meshtest hosts up HOSTS', or, where this
#                                       machine cannot make namespaces, say why and pass
#   multinode.sh cleanup                fixture: 'meshtest hosts down'
#   multinode.sh test HOSTS NP MAP BIN [ARGS...]
#                                       the gtest binary at NP ranks over HOSTS hosts, --map-by MAP,
#                                       each test's deadline 180 s (MESHTEST_TEST_TIMEOUT if set):
#                                       over TCP between the hosts, with both cores shared with
#                                       other jobs, a test that takes 5 s alone once passed the
#                                       harness's 60 s (test_ccl_shm's MultiChunkCallsMatchReferences
#                                       at np 8: one rank computing its p^2 references while the
#                                       seven others spun in the next collective)
#   multinode.sh fault HOSTS NP MAP BIN CASE
#                                       harness_case's CASE, in which the last rank (on the
#                                       last host under either mapping) fails: the job must
#                                       end non-zero within DEADLINE + 10 s, name that rank,
#                                       and leave no process on any host
# Exit 77 (CTest: skipped) when the hosts are not up because this machine cannot make them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
meshtest="$here/../../launch/meshtest"
deadline=${MESHTEST_TEST_TIMEOUT:-20}  # the harness's per-test deadline in the fault cases

skip_unless_up() {
  [[ "$("$meshtest" hosts status)" != "no simulated hosts"* ]] && return 0
  local why
  if why=$("$meshtest" hosts check 2>&1); then
    echo "multinode: no simulated hosts are up, though they can be made here: the fixture" \
      "(multinode.hosts_up) did not run or failed" >&2
    exit 1
  fi
  echo "skipped: ${why#*: }"
  exit 77
}

case "${1:-}" in
  setup)
    if why=$("$meshtest" hosts check 2>&1); then
      exec "$meshtest" hosts up "$2"
    fi
    echo "multinode: the multinode tests will be skipped: ${why#*: }"
    ;;
  cleanup) exec "$meshtest" hosts down ;;
  test)
    skip_unless_up
    hosts=$2 np=$3 map=$4
    shift 4
    MESHTEST_TEST_TIMEOUT=${MESHTEST_TEST_TIMEOUT:-180} exec "$meshtest" run --no-tag-output \
      --hosts "$hosts" --map-by "$map" -np "$np" "$@"
    ;;
  fault)
    skip_unless_up
    hosts=$2 np=$3 map=$4 bin=$5 case=$6
    last=$((np - 1))
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    start=$EPOCHREALTIME
    rc=0
    MESHTEST_TEST_TIMEOUT=$deadline GTEST_COLOR=no timeout -k 5 $((deadline + 60)) \
      "$meshtest" run --no-tag-output --hosts "$hosts" --map-by "$map" -np "$np" "$bin" \
      --gtest_filter="$case" </dev/null >"$log" 2>&1 || rc=$?
    seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    sed 's/^/    | /' "$log" | tail -n 30
    failed=0
    check() {  # check <ok 0|1> <message>
      if [[ "$1" == 1 ]]; then echo "pass: $2"; else echo "FAIL: $2"; failed=1; fi
    }
    # (mpirun's own status is 137 when a rank died of SIGKILL; the timeout's is 124 or 137
    # after deadline + 60 s.)
    check "$([[ $rc -ne 0 && $rc -ne 124 ]] && awk -v s="$seconds" -v m=$((deadline + 60)) \
      'BEGIN { exit !(s < m) }' && echo 1 || echo 0)" "the job ended non-zero on its own (exit $rc)"
    check "$(awk -v s="$seconds" -v m=$((deadline + 10)) 'BEGIN { print (s <= m) ? 1 : 0 }')" \
      "ended within the deadline + 10 s = $((deadline + 10)) s (took $seconds s)"
    # The harness's "[rank R/N]" or mpirun's "process rank R".
    check "$(grep -qE "\[rank $last/$np\]|rank $last " "$log" && echo 1 || echo 0)" \
      "names rank $last (on $(grep -oE "meshtest-h[0-9]+" "$log" | sort -u | tr '\n' ' ' || true))"
    # Nothing left on any host (orted and ranks end within a few seconds of mpirun).
    left=""
    for i in 1 2 3 4 5 6 7 8 9 10; do
      left=$(for h in $(seq 1 "$hosts"); do ip netns pids "meshtest-h$h" 2>/dev/null; done |
        xargs -r ps -o pid=,comm= -p 2>/dev/null | grep -E "$(basename "$bin")|orted" || true)
      [[ -n "$left" ]] || break
      sleep 0.5
    done
    check "$([[ -z "$left" ]] && echo 1 || echo 0)" "no process left on the hosts${left:+: $left}"
    echo "multinode fault $case np $np --map-by $map: ${seconds} s"
    exit "$failed"
    ;;
  *) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
