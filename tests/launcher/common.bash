# common.bash — sourced by the launcher's test scripts.

# fail <message> [output...]: prints the failure and the output it concerns, then exits 1.
fail() {
  echo "FAIL: $1" >&2
  shift
  printf '%s\n' "$@" | sed 's/^/  | /' >&2
  exit 1
}

# expect <exit> <text> <command...>: the command ends within 20 s with that exit and text.
expect() {
  local want=$1 text=$2 rc=0 out
  shift 2
  out=$(timeout 20 "$@" 2>&1) || rc=$?
  [[ $rc -eq $want ]] || fail "$* exited $rc, expected $want" "$out"
  grep -qF -- "$text" <<<"$out" || fail "$*: no '$text' in the output" "$out"
}
