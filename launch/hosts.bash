# hosts.bash — simulated hosts on one Linux machine, for running MPI jobs "across nodes"
# without a cluster. Sourced by launch/meshtest (launch/common.bash provides say, die,
# usage_error, ...).
#
# `hosts up N` makes N hosts meshtest-h1..N. Each is a set of namespaces of this machine:
#   network   its own, joined to the others by a veth pair on a bridge (mtbr0, 10.77.0.1/24
#             here; host i is 10.77.0.(10+i)); Open MPI's TCP transports cross it, so ranks
#             on different hosts talk over TCP as on a cluster;
#   hostname  meshtest-h<i> (UTS namespace), so MPI_COMM_TYPE_SHARED splits by host;
#   mounts    its own /dev/shm (so shared memory cannot cross hosts) and an /etc/hosts that
#             names every host.
# The network namespace is /run/netns/<host> (ip netns); the UTS and mount namespaces are
# bind-mounted at $MESHTEST_HOSTS_DIR/<host>.{uts,mnt} (default /run/meshtest-hosts), a
# private mount of its own. launch/hosts-agent, given to mpirun as plm_rsh_agent, enters a
# host's namespaces where mpirun would ssh to it. mpirun itself stays outside, on the bridge.
# `hosts down` kills what runs on the hosts and removes it all. Root only (namespaces and
# mounts need CAP_SYS_ADMIN and CAP_NET_ADMIN).

HOSTS_DIR=${MESHTEST_HOSTS_DIR:-/run/meshtest-hosts}
HOSTS_NET=${MESHTEST_HOSTS_NET:-10.77.0}  # the first three octets of a free /24
HOSTS_BRIDGE=mtbr0
HOSTS_MAX=16

usage_hosts() {
  cat <<EOF
Usage: $PROG hosts up [N] | down | status | check

Simulated hosts on this machine, for running MPI jobs across "nodes" without a
cluster (root only). Each host is a set of Linux namespaces: its own network
(veth on the bridge $HOSTS_BRIDGE, $HOSTS_NET.0/24; host i is $HOSTS_NET.(10+i)),
its own hostname meshtest-h<i> and its own /dev/shm, so Open MPI sees separate
nodes: shared memory stays within a host, TCP goes between hosts.

  up [N]    make N hosts (default 2, at most $HOSTS_MAX); replaces hosts already up
  down      kill every process on the hosts and remove them
  status    the hosts that are up, and the processes on each
  check     exit 0 if hosts can be made here, else say why and exit 3

Then:
  $PROG run --hosts 2 [--map-by node|slot] -np 4 BINARY
  $PROG matrix --hosts 2 [--map-by node|slot] --np "4 8"
  ctest -L multinode     (its fixture runs 'hosts up 2' and 'hosts down')

State: $HOSTS_DIR (MESHTEST_HOSTS_DIR); subnet: MESHTEST_HOSTS_NET (now $HOSTS_NET).
On a real cluster use 'run --hostfile FILE' or srun instead: docs/multi-node.md.
EOF
}

hosts_name() { echo "meshtest-h$1"; }
hosts_ip() { echo "$HOSTS_NET.$((10 + $1))"; }

# The number of hosts up (0 when none).
hosts_count() {
  if [[ -r "$HOSTS_DIR/count" ]]; then cat "$HOSTS_DIR/count"; else echo 0; fi
}

# Why hosts cannot be made here (empty: they can).
hosts_unavailable_reason() {
  if ! is_root; then
    echo "simulated hosts need root (network and mount namespaces); this is uid $EUID"
    return
  fi
  local c
  for c in ip unshare nsenter mount umount; do
    command -v "$c" >/dev/null || { echo "'$c' is not installed (packages iproute2, util-linux)"; return; }
  done
  local err
  if ! err=$(unshare --net --uts --mount --propagation private true 2>&1); then
    echo "this machine does not let root make namespaces (unshare: ${err:-failed}): a container without CAP_SYS_ADMIN?"
    return
  fi
  if ! err=$(ip link add mtprobe0 type bridge 2>&1); then
    echo "cannot make network devices (ip link add: ${err:-failed}): no CAP_NET_ADMIN?"
    return
  fi
  ip link del mtprobe0 2>/dev/null || true
}

hosts_check() {
  local why
  why=$(hosts_unavailable_reason)
  if [[ -n "$why" ]]; then
    echo "$PROG hosts: cannot make simulated hosts here: $why" >&2
    return 3
  fi
  echo "$PROG hosts: simulated hosts can be made here"
}

hosts_down() {
  local n i h pids
  n=$(hosts_count)
  # Every host that may exist, also those of a run that died half way through `up`.
  for ((i = 1; i <= HOSTS_MAX; i++)); do
    h=$(hosts_name "$i")
    if [[ -e "/run/netns/$h" ]]; then
      pids=$(ip netns pids "$h" 2>/dev/null | tr '\n' ' ')
      # shellcheck disable=SC2086
      [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
      ip netns del "$h" 2>/dev/null || true
    fi
    ip link del "mtv$i" 2>/dev/null || true
    local f
    for f in "$HOSTS_DIR/$h.mnt" "$HOSTS_DIR/$h.uts"; do
      if [[ -e "$f" ]]; then
        umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
        rm -f "$f"
      fi
    done
  done
  ip link del "$HOSTS_BRIDGE" 2>/dev/null || true
  if [[ -d "$HOSTS_DIR" ]]; then
    mountpoint -q "$HOSTS_DIR" && { umount "$HOSTS_DIR" 2>/dev/null || umount -l "$HOSTS_DIR" || true; }
    rm -rf "$HOSTS_DIR"
  fi
  [[ "$n" == 0 ]] || say "hosts down: removed $n simulated hosts"
}

hosts_up() {
  local n=$1 why i h ip
  why=$(hosts_unavailable_reason)
  [[ -z "$why" ]] || { echo "$PROG hosts: cannot make simulated hosts here: $why" >&2; return 3; }
  hosts_down >/dev/null
  mkdir -p "$HOSTS_DIR"
  # A private mount of its own, so that the namespace files bound below stay out of
  # other mount namespaces (ip netns does the same for /run/netns).
  mount --bind "$HOSTS_DIR" "$HOSTS_DIR"
  mount --make-private "$HOSTS_DIR"
  {
    echo "127.0.0.1 localhost"
    echo "$HOSTS_NET.1 meshtest-head"
    for ((i = 1; i <= n; i++)); do echo "$(hosts_ip "$i") $(hosts_name "$i")"; done
  } >"$HOSTS_DIR/etc-hosts"
  ip link add "$HOSTS_BRIDGE" type bridge
  ip addr add "$HOSTS_NET.1/24" dev "$HOSTS_BRIDGE"
  # Bridged traffic between hosts must not go through this machine's firewall (a FORWARD
  # policy of DROP, as container runtimes set, would stop every message between hosts).
  ip link set "$HOSTS_BRIDGE" type bridge nf_call_iptables 0 nf_call_ip6tables 0 \
    nf_call_arptables 0 2>/dev/null || true
  ip link set "$HOSTS_BRIDGE" up
  for ((i = 1; i <= n; i++)); do
    h=$(hosts_name "$i")
    ip=$(hosts_ip "$i")
    ip netns add "$h"
    ip link add "mtv$i" type veth peer name eth0 netns "$h"
    ip link set "mtv$i" master "$HOSTS_BRIDGE" up
    ip -n "$h" addr add "$ip/24" dev eth0
    ip -n "$h" link set eth0 up
    ip -n "$h" link set lo up
    touch "$HOSTS_DIR/$h.uts" "$HOSTS_DIR/$h.mnt"
    unshare --uts="$HOSTS_DIR/$h.uts" --mount="$HOSTS_DIR/$h.mnt" --propagation private \
      /bin/sh -c "hostname '$h' && mount -t tmpfs -o mode=1777 meshtest-shm /dev/shm &&
                  mount --bind '$HOSTS_DIR/etc-hosts' /etc/hosts"
  done
  echo "$n" >"$HOSTS_DIR/count"
  # Every host reaches every other one (and the head, where mpirun runs) over the bridge.
  for ((i = 1; i <= n; i++)); do
    local j=$((i % n + 1))
    if ! nsenter --net="/run/netns/$(hosts_name "$i")" ping -c 1 -W 2 "$(hosts_ip "$j")" >/dev/null 2>&1 &&
      ! nsenter --net="/run/netns/$(hosts_name "$i")" ping -c 1 -W 2 "$HOSTS_NET.1" >/dev/null 2>&1; then
      command -v ping >/dev/null || break  # no ping here: the first MPI job will tell
      hosts_down >/dev/null
      die "hosts up: $(hosts_name "$i") cannot reach $(hosts_ip "$j") over $HOSTS_BRIDGE (a firewall on bridged traffic?)"
    fi
  done
  say "hosts up: $n simulated hosts: $(for ((i = 1; i <= n; i++)); do printf '%s (%s) ' "$(hosts_name "$i")" "$(hosts_ip "$i")"; done)"
  echo "    run a job across them: $PROG run --hosts $n -np 4 BINARY"
}

hosts_status() {
  local n i h
  n=$(hosts_count)
  if [[ "$n" == 0 ]]; then
    echo "no simulated hosts ($PROG hosts up [N] makes them)"
    return 0
  fi
  echo "$n simulated hosts ($HOSTS_DIR):"
  for ((i = 1; i <= n; i++)); do
    h=$(hosts_name "$i")
    printf '  %-12s %-12s %s processes\n' "$h" "$(hosts_ip "$i")" \
      "$(ip netns pids "$h" 2>/dev/null | wc -l)"
  done
}

# hosts_mpirun_flags <hosts> <np> <map>: mpirun's flags for a job of np ranks spread over the
# first <hosts> simulated hosts, one a line: a hostfile giving each host ceil(np / hosts)
# slots, --map-by node (rank r on host r mod hosts) or slot (ranks filling one host, then the
# next), the rsh launcher with the agent (also where the environment picks another, e.g.
# OMPI_MCA_plm=isolated in containers), and TCP kept on the bridge's subnet.
hosts_mpirun_flags() {
  local want=$1 np=$2 map=$3 i slots file  # hosts_options checked that want hosts are up
  slots=$(((np + want - 1) / want))
  file="$HOSTS_DIR/hostfile-$want-$slots"
  if [[ ! -f "$file" ]]; then
    for ((i = 1; i <= want; i++)); do echo "$(hosts_name "$i") slots=$slots"; done >"$file.tmp"
    mv "$file.tmp" "$file"
  fi
  # Every simulated host shares this machine's cores, which Open MPI cannot see from the
  # hostfile's slots: idle ranks must yield (else busy-polling ranks starve the others and a
  # test takes 50 times longer).
  printf '%s\n' --hostfile "$file" --map-by "$map" --mca mpi_yield_when_idle 1 \
    --mca plm rsh --mca plm_rsh_agent "$ROOT/launch/hosts-agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$HOSTS_NET.0/24" --mca btl_tcp_if_include "$HOSTS_NET.0/24"
}

cmd_hosts() {
  local action=${1:-}
  [[ $# -eq 0 ]] || shift
  case "$action" in
    "" | -h | --help | help) usage_hosts; [[ -n "$action" ]] || return 2 ;;
    up)
      local n=${1:-2}
      [[ $# -le 1 ]] || usage_error hosts "up takes one count, not '$*'"
      is_posint "$n" || usage_error hosts "up: '$n' is not a positive integer"
      n=$((10#$n))
      [[ $n -ge 1 && $n -le $HOSTS_MAX ]] || usage_error hosts "up: between 1 and $HOSTS_MAX hosts, not $n"
      hosts_up "$n"
      ;;
    down) [[ $# -eq 0 ]] || usage_error hosts "down takes no arguments"; hosts_down ;;
    status) hosts_status ;;
    check) hosts_check ;;
    *) usage_error hosts "unknown action '$action' (up, down, status or check)" ;;
  esac
}

# hosts_options <sub> <hosts> <map>: checks run's or matrix's --hosts N and --map-by M (either
# may be empty) and dies unless that many simulated hosts are up; sets HOSTS_WANT (N without
# leading zeros, or empty).
hosts_options() {
  local sub=$1 hosts=$2 map=$3
  HOSTS_WANT=""
  if [[ -n "$map" ]]; then
    [[ "$map" == node || "$map" == slot ]] || usage_error "$sub" "--map-by must be node or slot, not '$map'"
  fi
  [[ -n "$hosts" ]] || return 0
  is_posint "$hosts" || usage_error "$sub" "--hosts needs a positive integer, not '$hosts'"
  HOSTS_WANT=$((10#$hosts))
  hosts_require "$HOSTS_WANT"
}

# hosts_require <hosts>: dies unless that many simulated hosts are up.
hosts_require() {
  local want=$1 n
  n=$(hosts_count)
  [[ "$n" != 0 ]] || die "no simulated hosts are up: run '$PROG hosts up $want' first (root only)"
  [[ $want -le $n ]] || die "--hosts $want: only $n simulated hosts are up (run '$PROG hosts up $want')"
}

# hostfile_check <file> <np> <oversubscribe 0|1>: a user's hostfile must name hosts that
# resolve, and give np ranks enough slots unless --oversubscribe: said here, before mpirun
# (which would try to ssh to a name that does not resolve, or print its own slot message).
hostfile_check() {
  local file=$1 np=$2 over=$3 hosts=0 slots=0 counted=1 line host rest
  [[ -r "$file" && -f "$file" ]] || die "run: cannot read hostfile '$file'"
  while IFS= read -r line || [[ -n "$line" ]]; do
    line=${line%%#*}
    read -r host rest <<<"$line" || true
    [[ -n "${host:-}" ]] || continue
    hosts=$((hosts + 1))
    if [[ "$rest" =~ (^|[[:space:]])slots=([0-9]+) ]]; then
      slots=$((slots + 10#${BASH_REMATCH[2]}))
    else
      counted=0  # Open MPI then counts the host's cores, which only it can see
    fi
    if [[ "$host" != localhost && ! -e "/run/netns/$host" && ! "$host" =~ ^[0-9.]+$ &&
      ! "$host" =~ : ]] && command -v getent >/dev/null &&
      ! getent hosts "$host" >/dev/null; then
      die "run: host '$host' in hostfile '$file' does not resolve (not in DNS or /etc/hosts)"
    fi
  done <"$file"
  [[ $hosts -gt 0 ]] || die "run: hostfile '$file' names no hosts (one 'HOST slots=N' a line)"
  if [[ $counted -eq 1 && $np -gt $slots && $over -eq 0 ]]; then
    die "run: -np $np but hostfile '$file' gives $slots slots on $hosts hosts; add slots," \
      "or --mpirun-arg --oversubscribe to run more ranks than slots"
  fi
}
