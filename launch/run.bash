# run.bash — `meshtest run`: mpirun with the flags this machine needs (oversubscribe,
# run as root, hostfile or simulated hosts); binaries found by name in the build. demo and
# bench run through cmd_run, matrix through mpirun_flags. Sourced by launch/meshtest.

usage_run() {
  cat <<EOF
Usage: $PROG run [options] -np N BINARY [ARGS...]

mpirun -np N BINARY ARGS with the right flags for this machine:
  --oversubscribe      when N exceeds the cores (and no hostfile is given)
  --allow-run-as-root  when run as root (OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}=1 are
                       exported too, for jobs the binary itself starts)
  --tag-output         every line prefixed by [job,rank]<stream>
and MESHTEST_REPORTS_DIR=<repo>/reports, so the harness writes ranks 1..N-1's
output to reports/logs/rank<r>.log whatever the current directory.

  -np N, -n N            number of ranks (required)
  --per-rank-logs DIR    also write each rank's output to
                         DIR/1/rank.<r>/{stdout,stderr} (mpirun --output-filename)
  --no-tag-output        no [job,rank] prefixes
  --hostfile FILE        passed to mpirun (--machinefile too); disables the
                         automatic --oversubscribe: the hostfile sets the slots.
                         Checked first: its hosts must resolve, and with slots=
                         on every line, -np must fit (docs/multi-node.md)
  --hosts N              spread the ranks over the first N simulated hosts of
                         '$PROG hosts up' (root; each gets ceil(N_ranks/N) slots)
  --map-by node|slot     node: rank r on host r mod hosts (default with --hosts);
                         slot: fill one host, then the next
  --mpirun-arg ARG       one more argument for mpirun (repeat as needed)
  --dry-run              print the mpirun command, do not run it

BINARY is a path (from the current directory, else from the repo root) or a
name found in build/bin, build/mpi_tests, build/tests or PATH.
EOF
}

# mpirun_flags <np> <has_hostfile 0|1>: the machine-dependent flags, one a line.
mpirun_flags() {
  local np=$1 ncores
  ncores=$(cores)
  if [[ $2 -eq 0 && $np -gt $ncores ]]; then echo --oversubscribe; fi
  if [[ $EUID -eq 0 ]]; then echo --allow-run-as-root; fi
}

allow_root_env() {
  if [[ $EUID -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

resolve_binary() {
  local b=$1 dir d
  dir=$(build_dir)
  if [[ "$b" == */* ]]; then
    if [[ -e "$b" ]]; then abspath "$b"; return; fi
    if [[ "$b" != /* && -e "$ROOT/$b" ]]; then echo "$ROOT/$b"; return; fi
  else
    for d in "$dir/bin" "$dir/mpi_tests" "$dir/tests"; do
      if [[ -x "$d/$b" && -f "$d/$b" ]]; then echo "$d/$b"; return; fi
    done
    if type -P "$b" >/dev/null; then type -P "$b"; return; fi
  fi
  return 1
}

cmd_run() {
  local np="" logs="" hostfile="" tag=1 dry=0 hosts="" map=""
  local -a extra=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -np | -n | --np) need_value run "$@"; np=$2; shift 2 ;;
      --np=*) np=${1#--np=}; shift ;;
      --per-rank-logs) need_value run "$@"; logs=$2; shift 2 ;;
      --hostfile | -hostfile | --machinefile | -machinefile)
        need_value run "$@"; hostfile=$2; shift 2 ;;
      --hosts) need_value run "$@"; hosts=$2; shift 2 ;;
      --hosts=*) hosts=${1#--hosts=}; shift ;;
      --map-by) need_value run "$@"; map=$2; shift 2 ;;
      --map-by=*) map=${1#--map-by=}; shift ;;
      --no-tag-output) tag=0; shift ;;
      --tag-output) tag=1; shift ;;
      --mpirun-arg) need_value run "$@"; extra+=("$2"); shift 2 ;;
      --dry-run) dry=1; shift ;;
      -h | --help) usage_run; return 0 ;;
      --) shift; break ;;
      -*) usage_error run "unknown option '$1' (the binary's own options go after BINARY)" ;;
      *) break ;;
    esac
  done
  [[ -n "$np" ]] || usage_error run "missing -np N"
  is_posint "$np" || usage_error run "-np needs a positive integer, not '$np'"
  np=$((10#$np))
  [[ $# -gt 0 ]] || usage_error run "missing BINARY"
  local bin
  bin=$(resolve_binary "$1") || die "run: no such binary '$1' (looked in ., $(show "$ROOT"), $(show "$(build_dir)")/{bin,mpi_tests,tests} and PATH)"
  [[ -x "$bin" && -f "$bin" ]] || die "run: '$bin' is not an executable file"
  shift
  [[ -z "$hosts" || -z "$hostfile" ]] || usage_error run "--hosts and --hostfile exclude each other"
  hosts_options run "$hosts" "$map"
  hosts=$HOSTS_WANT
  local -a cmd=(mpirun -np "$np")
  mapfile -t -O 3 cmd < <(mpirun_flags "$np" "$([[ -n "$hostfile$hosts" ]] && echo 1 || echo 0)")
  [[ $tag -eq 1 ]] && cmd+=(--tag-output)
  if [[ -n "$hostfile" ]]; then
    local over=0
    [[ " ${extra[*]-} " == *" --oversubscribe "* ]] && over=1
    hostfile_check "$hostfile" "$np" "$over"
    cmd+=(--hostfile "$(abspath "$hostfile")")
    # ssh must neither prompt (a password, a new host key) nor wait minutes for a host that
    # does not answer: mpirun then reports the daemon that failed to start.
    [[ " ${extra[*]-} " == *" plm_rsh_args "* ]] ||
      cmd+=(--mca plm_rsh_args "-o BatchMode=yes -o ConnectTimeout=10")
    [[ -z "$map" ]] || cmd+=(--map-by "$map")
  elif [[ -n "$hosts" ]]; then
    mapfile -t -O "${#cmd[@]}" cmd < <(hosts_mpirun_flags "$hosts" "$np" "${map:-node}")
  elif [[ -n "$map" ]]; then
    cmd+=(--map-by "$map")
  fi
  if [[ -n "$hostfile$hosts" ]]; then
    # Ranks on other hosts start from a fresh login environment (ssh): pass on meshtest's and
    # GoogleTest's settings, and the reports directory exported below.
    local var
    for var in $(compgen -e | grep -E '^(MESHTEST|GTEST)_' || true); do cmd+=(-x "$var"); done
    [[ " ${cmd[*]} " == *" -x MESHTEST_REPORTS_DIR "* ]] || cmd+=(-x MESHTEST_REPORTS_DIR)
  fi
  if [[ -n "$logs" ]]; then
    logs=$(abspath "$logs")
    mkdir -p "$logs"
    cmd+=(--output-filename "$logs")
  fi
  cmd+=(${extra[@]+"${extra[@]}"} "$bin" "$@")
  say "running on $np ranks ($(cores) cores): ${cmd[*]}"
  [[ -z "$logs" ]] || say "per-rank logs: $(show "$logs")/1/rank.<r>/{stdout,stderr}"
  if [[ $dry -eq 1 ]]; then return 0; fi
  command -v mpirun >/dev/null || die "mpirun not found: run '$PROG setup' (package openmpi-bin)"
  allow_root_env
  # The harness writes ranks' logs to $MESHTEST_REPORTS_DIR/logs/rank<r>.log.
  export MESHTEST_REPORTS_DIR=$REPORTS
  # Open MPI gives ranks a pty, so gtest would colour output going to a file.
  [[ -t 1 ]] || export GTEST_COLOR=${GTEST_COLOR:-no}
  exec "${cmd[@]}"
}
