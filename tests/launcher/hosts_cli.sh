#!/usr/bin/env bash
# launch/meshtest's bad input around hosts: a hostfile that does not exist, names no hosts,
# names a host that does not resolve, or gives fewer slots than ranks (without
# --oversubscribe); --hosts without simulated hosts up, with --hostfile, with a bad --map-by;
# `hosts up` without root, with a bad count. Each must end at once with a clear message
# (run: exit 1; usage: exit 2; no root: exit 3), never start mpirun or hang.
# Usage: hosts_cli.sh <path of launch/meshtest>
set -euo pipefail
launcher=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MESHTEST_REPORTS_DIR=$work/reports MESHTEST_HOSTS_DIR=$work/no-hosts
bin=$(type -P true)
# shellcheck source=tests/launcher/common.bash
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"

printf '# nothing here\n\n' >"$work/empty"
printf 'no-such-host.invalid slots=2\n' >"$work/unknown"
printf 'localhost slots=2\n' >"$work/two"
expect 1 "cannot read hostfile '$work/missing'" "$launcher" run --hostfile "$work/missing" -np 2 "$bin"
expect 1 "names no hosts" "$launcher" run --hostfile "$work/empty" -np 2 "$bin"
expect 1 "host 'no-such-host.invalid' in hostfile '$work/unknown' does not resolve" \
  "$launcher" run --hostfile "$work/unknown" -np 2 "$bin"
expect 1 "-np 3 but hostfile '$work/two' gives 2 slots on 1 hosts" \
  "$launcher" run --hostfile "$work/two" -np 3 "$bin"
expect 0 "--oversubscribe" "$launcher" run --dry-run --hostfile "$work/two" \
  --mpirun-arg --oversubscribe -np 3 "$bin"
expect 0 "--map-by slot" "$launcher" run --dry-run --hostfile "$work/two" --map-by slot -np 2 "$bin"
expect 1 "no simulated hosts are up: run 'meshtest hosts up 2' first" \
  "$launcher" run --hosts 2 -np 4 "$bin"
expect 1 "no simulated hosts are up" "$launcher" matrix --no-build --hosts 2 --np 4 "$bin"
expect 2 "--hosts and --hostfile exclude each other" \
  "$launcher" run --hosts 2 --hostfile "$work/two" -np 2 "$bin"
expect 2 "--map-by must be node or slot, not 'core'" "$launcher" run --map-by core -np 2 "$bin"
expect 2 "--hosts needs a positive integer, not 'two'" "$launcher" run --hosts two -np 2 "$bin"
expect 2 "up: '0' is not a positive integer" "$launcher" hosts up 0
expect 2 "up: between 1 and 16 hosts, not 17" "$launcher" hosts up 17
expect 2 "unknown action 'sideways'" "$launcher" hosts sideways
expect 3 "simulated hosts need root" env MESHTEST_ASSUME_NONROOT=1 "$launcher" hosts up 2
expect 3 "simulated hosts need root" env MESHTEST_ASSUME_NONROOT=1 "$launcher" hosts check
expect 0 "no simulated hosts" "$launcher" hosts status
echo "hosts and hostfile: bad input refused with a clear message"
