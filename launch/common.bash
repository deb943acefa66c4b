# common.bash — the helpers every subcommand of launch/meshtest uses: messages and usage
# errors, integer checks, paths, timing, cores and XML escaping. Sourced by launch/meshtest,
# which sets ROOT (the repository), PROG (the name it was called by), REPORTS and JOBS.

say() { echo "==> $*"; }
warn() { echo "$PROG: warning: $*" >&2; }
die() { echo "$PROG: error: $*" >&2; exit 1; }
# usage_error <subcommand> <message>: a bad command line (exit 2).
usage_error() {
  echo "$PROG${1:+ $1}: $2" >&2
  echo "Try '$PROG${1:+ $1} --help'." >&2
  exit 2
}
need_value() { [[ $# -ge 3 && -n "$3" ]] || usage_error "$1" "option $2 needs a value"; }
# A positive decimal integer below 10^9 (leading zeros allowed: 08 is 8, not octal).
is_posint() { [[ "$1" =~ ^0*[1-9][0-9]{0,8}$ ]]; }
is_root() { [[ $EUID -eq 0 && "${MESHTEST_ASSUME_NONROOT:-0}" != 1 ]]; }
# Path shown in progress lines: relative to the repo root when inside it.
show() { local p=$1; [[ "$p" == "$ROOT/"* ]] && p=${p#"$ROOT/"}; echo "$p"; }
abspath() { if [[ "$1" = /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
now() { echo "$EPOCHREALTIME"; }
seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
hms() {  # 754.2 -> 12m34s
  awk -v s="$1" 'BEGIN { s = int(s + 0.5); if (s >= 60) printf "%dm%02ds", s / 60, s % 60; else printf "%ds", s }'
}
# Physical cores mpirun can place ranks on (it counts cores, not hardware threads).
cores() {
  local n phys
  n=$(nproc 2>/dev/null || echo 1)
  phys=$(lscpu -p=Core,Socket 2>/dev/null | grep -v '^#' | sort -u | wc -l || true)
  if [[ "$phys" =~ ^[0-9]+$ && "$phys" -gt 0 && "$phys" -lt "$n" ]]; then n=$phys; fi
  echo "$n"
}
xml_escape() {
  sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g' |
    tr -d '\000-\010\013\014\016-\037'
}
