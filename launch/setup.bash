# setup.bash — `meshtest setup`: the Debian packages of launch/packages.txt, checked with
# dpkg-query and installed with apt-get (as root; otherwise the sudo line to run). build warns
# of missing ones, fuzz installs clang the same way (apt_install). Sourced by launch/meshtest.

usage_setup() {
  cat <<EOF
Usage: $PROG setup [--with-optional] [--check]

Checks (dpkg-query) the Debian packages listed in launch/packages.txt and
installs the missing ones: as root with
  apt-get update && apt-get install -y --no-install-recommends <missing>
(DEBIAN_FRONTEND=noninteractive). As another user it prints the exact
'sudo apt-get install ...' line and exits 1.

  --with-optional   also the packages marked optional in packages.txt (none at
                    present: gnuplot-nox, for the perf plots, is required)
  --check           only report; exit 1 if a package is missing
EOF
}

# read_packages <with_optional 0|1>: the package names, one a line.
read_packages() {
  [[ -r "$PACKAGES_FILE" ]] || die "package list $PACKAGES_FILE is missing"
  awk -v opt="$1" '{ sub(/#.*/, "") } NF == 0 { next }
                   $2 == "optional" { if (opt == 1) print $1; next } { print $1 }' "$PACKAGES_FILE"
}

# missing_packages <with_optional>: the listed packages dpkg does not have installed.
missing_packages() {
  local p
  while read -r p; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done < <(read_packages "$1")
}

# apt_install <package...>: as root, apt-get update and install them; as another user, print
# the sudo line to run and exit 1.
apt_install() {
  if ! is_root; then
    echo "$PROG: installing packages needs root. Run this, then try again:" >&2
    echo "sudo apt-get install -y --no-install-recommends $*" >&2
    echo "(run 'sudo apt-get update' first if apt cannot find a package)" >&2
    exit 1
  fi
  say "installing (apt-get update && apt-get install -y --no-install-recommends $*)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "$@"
}

cmd_setup() {
  local with_optional=0 check_only=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --with-optional) with_optional=1 ;;
      --check) check_only=1 ;;
      -h | --help) usage_setup; return 0 ;;
      *) usage_error setup "unknown option '$1'" ;;
    esac
    shift
  done
  do_setup "$with_optional" "$check_only"
}

# do_setup <with_optional 0|1> <check_only 0|1>
do_setup() {
  local with_optional=$1 check_only=$2
  if ! command -v dpkg-query >/dev/null; then
    warn "dpkg-query not found (not Debian or Ubuntu?): install the equivalents of"
    warn "  $(read_packages "$with_optional" | tr '\n' ' ')"
    return 0
  fi
  local -a all missing
  mapfile -t all < <(read_packages "$with_optional")
  mapfile -t missing < <(missing_packages "$with_optional")
  if [[ ${#missing[@]} -eq 0 ]]; then
    say "setup: all ${#all[@]} Debian packages are installed"
    return 0
  fi
  say "setup: ${#missing[@]} of ${#all[@]} Debian packages missing: ${missing[*]}"
  if [[ $check_only -eq 1 ]]; then
    return 1
  fi
  apt_install "${missing[@]}"
  mapfile -t missing < <(missing_packages "$with_optional")
  [[ ${#missing[@]} -eq 0 ]] || die "still missing after apt-get install: ${missing[*]}"
  say "setup: all ${#all[@]} Debian packages are installed"
}
