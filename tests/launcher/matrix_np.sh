#!/usr/bin/env bash
# launch/meshtest matrix --np takes any list of rank counts: spaces or commas, leading zeros
# (08 is 8), counts above the cores, a repeated count run once, in the order given; a bad list
# is a usage error (exit 2) naming the bad entry. The "test binary" is true(1) under mpirun
# (no gtest XML: each run passes); reports go to a temporary directory.
# Usage: matrix_np.sh <path of launch/meshtest>
set -euo pipefail
launcher=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MESHTEST_REPORTS_DIR=$work
bin=$(type -P true)
# shellcheck source=tests/launcher/common.bash
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"

# 1 and 3 ranks on any machine; 3 is oversubscribed on a 2-core one.
rc=0
out=$("$launcher" matrix --no-build --np "3, 1 03,,1" "$bin" 2>&1) || rc=$?
[[ $rc -eq 0 ]] || fail "matrix --np '3, 1 03,,1' exited $rc" "$out"
grep -q "x np {3 1} = 2 runs" <<<"$out" || fail "the list is not {3 1}" "$out"
grep -Eq "^true +pass +[0-9.]+s +pass +[0-9.]+s$" <<<"$out" || fail "no table row 'true pass pass'" "$out"
grep -q "matrix: 2 passed, 0 failed, 0 skipped (2 runs" <<<"$out" || fail "no summary line" "$out"
[[ -e "$work/matrix/true.np3.log" && -s "$work/matrix-junit.xml" ]] || fail "no per-run log or JUnit"

for bad in "0" "4 -1" "two" "1e3" "6;12" "," "12345678901"; do
  rc=0
  out=$("$launcher" matrix --no-build --np "$bad" "$bin" 2>&1) || rc=$?
  [[ $rc -eq 2 ]] || fail "--np '$bad': exit $rc, expected 2 (usage error)" "$out"
  grep -Eq "is not a positive integer|needs at least one rank count" <<<"$out" ||
    fail "--np '$bad': no clear message" "$out"
done
echo "matrix --np: lists parsed, bad lists refused"
