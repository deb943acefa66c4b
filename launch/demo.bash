# demo.bash — `meshtest demo`: setup, build, then meshtest-demo on 8 ranks (a 2x4 mesh).
# Sourced by launch/meshtest.

usage_demo() {
  cat <<EOF
Usage: $PROG demo [build options] [--no-setup] [-- DEMO_ARGS...]

setup + build, then: $PROG run --no-tag-output -np 8 build/bin/meshtest-demo DEMO_ARGS
(each CCL on each axis of a 2x4 mesh, checked against the single-device run).

$(build_options_help)
  --no-setup        skip the package check
EOF
}

cmd_demo() {
  local setup=1
  while [[ $# -gt 0 ]]; do
    build_opt demo "$@"
    if [[ $CONSUMED -gt 0 ]]; then shift "$CONSUMED"; continue; fi
    case "$1" in
      --no-setup) setup=0; shift ;;
      -h | --help) usage_demo; return 0 ;;
      --) shift; break ;;
      *) usage_error demo "unknown option '$1' (the demo's own options go after --)" ;;
    esac
  done
  [[ $setup -eq 0 ]] || do_setup 0 0
  do_build
  local demo
  demo="$(build_dir)/bin/meshtest-demo"
  if [[ ! -x "$demo" ]]; then
    die "demo: $(show "$demo") was not built (the demo program: each CCL on each
  axis of a 2x4 mesh, checked against the single-device run). Everything else is
  built; try '$PROG test'."
  fi
  # Only rank 0 prints the table: no [job,rank] prefixes.
  cmd_run --no-tag-output -np 8 "$demo" "$@"
}
