# common.bash — sourced by the launcher's test scripts.

# fail <message> [output...]: prints the failure and the output it concerns, then exits 1.
fail() {
  echo "FAIL: $1" >&2
  shift
  printf '%s\n' "$@" | sed 's/^/  | /' >&2
  exit 1
}
