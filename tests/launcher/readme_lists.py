#!/usr/bin/env python3
"""readme_lists.py — README.md's hand-written lists checked against the registries they copy.

  benchmarks   README's benchmark table = `meshtest-bench --help`; `launch/meshtest bench
               --help` lists the same ones, its examples name registered ones, and without
               a built meshtest-bench it says so
  subcommands  README's subcommands (the "Two commands" block and the subcommand table) =
               the launcher's (its "one of: ..." list), and `launch/meshtest --help` lists them
  programs     the meshtest-<name> programs of README's Layout = those in <build>/bin, and
               every one README names anywhere is there
  rank counts  README's table of rank counts = the MPI tests CMake registered in <build>
               (`ctest --show-only=json-v1`: <name>.np<N> running <build>/mpi_tests/<binary>):
               the default row's counts are those of the runs not labelled scale, the scale
               row's those of the runs labelled scale, each but the counts of the rows naming
               `binaries`, which must be exactly the binaries registered at those counts;
               `launch/meshtest matrix --help` and `test --help` quote the same counts.
               Checked only when <build> keeps the sources' defaults of MESHTEST_DEFAULT_NPS,
               MESHTEST_SCALE_NPS, MESHTEST_NP32_TESTS and MESHTEST_SCALE_TESTS (README
               describes those); otherwise noted and skipped.
  docs         README's Documentation list = the pages in docs/

Each difference is printed as a FAIL line naming what is missing on which side; exit 1 if any.
Usage: readme_lists.py <source dir> <build dir> [--no-bench] [--ctest FILE]
"""

import argparse
import json
import os
import re
import subprocess
import sys

failures = []


def fail(what, message):
    failures.append(f"FAIL: {what}: {message}")


def ok(what):
    print(f"ok: {what}")


def run(cmd, env=None):
    """(exit status, stdout + stderr) of cmd, which must end within 60 s."""
    full_env = dict(os.environ, **(env or {}))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=full_env, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, f"{' '.join(cmd)}: {e}"
    return p.returncode, p.stdout


def compare(what, readme, registry, readme_name="README.md", registry_name="the registry"):
    """Fails naming the names on one side only; True when the two sets are equal."""
    missing = sorted(registry - readme)
    extra = sorted(readme - registry)
    if not missing and not extra:
        ok(f"{what}: {' '.join(map(str, sorted(registry)))}")
        return True
    parts = []
    if missing:
        parts.append(f"in {registry_name} but not in {readme_name}: {', '.join(map(str, missing))}")
    if extra:
        parts.append(f"in {readme_name} but not in {registry_name}: {', '.join(map(str, extra))}")
    fail(what, "; ".join(parts))
    return False


def table_rows(text, header):
    """The rows (lists of cells) of the Markdown table whose first header cell is `header`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == header:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))])
            return rows
    return None


def section(text, start, end):
    """The lines of text from the first line matching start up to the next matching end."""
    out, inside = [], False
    for line in text.splitlines():
        if inside and re.search(end, line):
            break
        if inside:
            out.append(line)
        elif re.search(start, line):
            inside = True
    return out


def counts(text):
    return {int(n) for n in re.findall(r"\d+", text)}


# ------------------------------------------------------------------------------- benchmarks

def check_benchmarks(readme, launcher, build, bench):
    if not os.access(bench, os.X_OK):
        fail("benchmarks", f"no {bench}: build meshtest-bench first (its --help is the registry)")
        return
    rc, out = run([bench, "--help"])
    registry = {m.group(1) for m in re.finditer(r"(?m)^  (\S+)\s{2,}\S", out)}
    if rc != 0 or not registry:
        fail("benchmarks", f"'{bench} --help' exited {rc} and listed no benchmarks:\n{out}")
        return
    rows = table_rows(readme, "benchmark")
    if rows is None:
        fail("benchmarks", "README.md has no table headed '| benchmark |'")
        return
    listed = set()
    for row in rows:
        m = re.fullmatch(r"`([^`]+)`", row[0])
        if not m:
            fail("benchmarks", f"README.md's benchmark table: a row without a `name`: {row[0]}")
            continue
        listed.add(m.group(1))
    compare("README.md's benchmark table vs meshtest-bench --help", listed, registry,
            registry_name="meshtest-bench --help")

    rc, out = run([launcher, "bench", "--help"], env={"MESHTEST_BUILD_DIR": build})
    shown = section(out, r"^Benchmarks \(", r"^\s*$")
    compare("launch/meshtest bench --help vs meshtest-bench --help",
            {m.group(1) for line in shown if (m := re.match(r"^  (\S+)\s{2,}", line))}, registry,
            readme_name="launch/meshtest bench --help", registry_name="meshtest-bench --help")
    examples = {m.group(1) for line in section(out, r"^Examples:", r"^\s*$")
                if (m := re.search(r"\bbench (\S+)", line))}
    if not examples <= registry:
        fail("launch/meshtest bench --help's examples",
             f"not registered benchmarks: {', '.join(sorted(examples - registry))}")
    # Without a built meshtest-bench the help says so (and how to get the list) instead.
    rc, out = run([launcher, "bench", "--help"],
                  env={"MESHTEST_BUILD_DIR": os.path.join(build, "no-such-build")})
    if rc != 0 or "is not built yet" not in out:
        fail("launch/meshtest bench --help without meshtest-bench",
             f"exit {rc}, no 'is not built yet' in:\n{out}")


# ------------------------------------------------------------------------------ subcommands

def check_subcommands(readme, launcher):
    rc, out = run([launcher, "no-such-subcommand"])
    m = re.search(r"one of: ([^)]*)\)", out)
    if rc != 2 or not m:
        fail("subcommands", f"'launch/meshtest no-such-subcommand' did not list the subcommands "
                            f"(exit {rc}):\n{out}")
        return
    registry = set(m.group(1).split())
    rc, out = run([launcher, "--help"])
    helped = {m.group(1) for line in section(out, r"^Usage:", r"^Environment:")
              if (m := re.match(r"^  ([a-z][a-z-]*)\b", line))} - {"help"}
    compare("launch/meshtest --help vs its subcommands", helped, registry,
            readme_name="launch/meshtest --help", registry_name="the launcher's dispatch")

    listed = set(re.findall(r"\./launch/meshtest ([a-z-]+)",
                            "\n".join(section(readme, r"^## Two commands", r"^```\s*$|^## "))))
    rows = table_rows(readme, "subcommand")
    if rows is None:
        fail("subcommands", "README.md has no table headed '| subcommand |'")
        return
    for row in rows:
        m = re.match(r"`([a-z-]+)", row[0])
        if m:
            listed.add(m.group(1))
        else:
            fail("subcommands", f"README.md's subcommand table: a row without a `name`: {row[0]}")
    compare("README.md's subcommands vs the launcher's", listed, registry,
            registry_name="launch/meshtest")


# --------------------------------------------------------------------------------- programs

def check_programs(readme, build, with_bench):
    bindir = os.path.join(build, "bin")
    built = {f for f in os.listdir(bindir) if f.startswith("meshtest-")
             and os.access(os.path.join(bindir, f), os.X_OK)} if os.path.isdir(bindir) else set()
    program = r"`(?:[\w./-]*/)?(meshtest-[a-z0-9][a-z0-9-]*)"
    layout = set(re.findall(program, "\n".join(section(readme, r"^## Layout", r"^## "))))
    named = set(re.findall(program, readme))
    if not with_bench:
        built.discard("meshtest-bench")
        layout.discard("meshtest-bench")
        named.discard("meshtest-bench")
    compare("README.md's Layout programs vs <build>/bin", layout, built,
            readme_name="README.md's Layout", registry_name=bindir)
    if not named <= built:
        fail("programs", f"README.md names programs not in {bindir}: "
                         f"{', '.join(sorted(named - built))}")


# ------------------------------------------------------------------------------ rank counts

def cache_value(build, var):
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                m = re.match(rf"{var}:[A-Z]+=(.*)$", line.rstrip("\n"))
                if m:
                    return m.group(1).replace(";", " ").split()
    except OSError:
        pass
    return None


def source_default(source, path, pattern):
    with open(os.path.join(source, path)) as f:
        m = re.search(pattern, f.read())
    return m.group(1).split() if m else None


def default_configuration(source, build):
    """True when build keeps the sources' defaults of the settings the README's table states."""
    settings = [
        ("MESHTEST_DEFAULT_NPS", "cmake/meshtest_testing.cmake",
         r"set\(MESHTEST_DEFAULT_NPS\s+([\d\s]+?)\s+CACHE"),
        ("MESHTEST_SCALE_NPS", "cmake/meshtest_testing.cmake",
         r"set\(MESHTEST_SCALE_NPS\s+([\d\s]+?)\s+CACHE"),
        ("MESHTEST_SCALE_TESTS", "cmake/meshtest_testing.cmake",
         r'option\(MESHTEST_SCALE_TESTS\s+"[^"]*"\s+(ON|OFF)\)'),
        ("MESHTEST_NP32_TESTS", "mpi_tests/CMakeLists.txt",
         r"set\(MESHTEST_NP32_TESTS\s+([\w\s]+?)\s+CACHE"),
    ]
    same = True
    for var, path, pattern in settings:
        default = source_default(source, path, pattern)
        if default is None:
            fail("rank counts", f"no default of {var} found in {path} (this check reads it there)")
            return False
        value = cache_value(build, var)
        if value is None:
            fail("rank counts", f"{var} is not in {build}/CMakeCache.txt")
            return False
        if value != default:
            print(f"note: rank counts not checked: this build sets {var}={' '.join(value)}, "
                  f"the README describes the default {' '.join(default)}")
            same = False
    return same


def registered_runs(build, ctest):
    """(np, binary, scale) of every MPI test run on <build>/mpi_tests/<binary>."""
    rc, out = run([ctest, "--test-dir", build, "--show-only=json-v1"])
    if rc != 0:
        fail("rank counts", f"ctest --show-only exited {rc}:\n{out[-2000:]}")
        return None
    mpi_dir = os.path.realpath(os.path.join(build, "mpi_tests"))
    runs = []
    for test in json.loads(out)["tests"]:
        m = re.search(r"\.np(\d+)$", test["name"])
        labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
        binary = next((os.path.basename(a) for a in test.get("command", [])
                       if os.path.dirname(os.path.realpath(a)) == mpi_dir), None)
        if m and binary and "mpi" in labels and "multinode" not in labels:
            runs.append((int(m.group(1)), binary, "scale" in labels))
    return runs


def check_rank_counts(readme, launcher, source, build, ctest):
    if not default_configuration(source, build):
        return
    runs = registered_runs(build, ctest)
    if runs is None:
        return
    if not runs:
        fail("rank counts", f"ctest lists no MPI tests on {build}/mpi_tests")
        return
    at = {}
    for np, binary, _ in runs:
        at.setdefault(np, set()).add(binary)
    scale_counts = {np for np, _, scale in runs if scale}
    plain_counts = {np for np, _, scale in runs if not scale}

    rows = table_rows(readme, "rank counts")
    if rows is None:
        fail("rank counts", "README.md has no table headed '| rank counts |'")
        return
    default_row = scale_row = None
    named = {}
    for row in rows:
        binaries = set(re.findall(r"`(test_\w+)`", row[1]))
        if binaries:
            for np in counts(row[0]):
                named[np] = binaries
        elif "`scale`" in row[1]:
            scale_row = counts(row[0])
        else:
            default_row = counts(row[0])
    if default_row is None or scale_row is None:
        fail("rank counts", "README.md's rank-count table needs a row for the default counts "
                            "and one (saying `scale`) for the scale counts")
        return
    compare("README.md's default rank counts vs the runs not labelled scale", default_row,
            plain_counts - named.keys(), registry_name="CMake's registered tests")
    compare("README.md's scale rank counts vs the runs labelled scale", scale_row,
            scale_counts - named.keys(), registry_name="CMake's registered tests")
    for np in sorted(named):
        compare(f"README.md's binaries at {np} ranks vs those registered", named[np],
                at.get(np, set()), registry_name="CMake's registered tests")
    differing = {np: at.get(np, set()) for np in scale_row if at.get(np) != at.get(min(scale_row))}
    if differing:
        fail("rank counts", f"README.md's scale row says the same tests at {sorted(scale_row)}, "
                            f"but the binaries differ at {sorted(differing)}")
    every = {binary for _, binary, _ in runs}
    unplaced = sorted(b for b in every if not any(b in at.get(np, set()) for np in default_row))
    if unplaced:
        fail("rank counts", f"README.md says every MPI test binary runs at {sorted(default_row)}, "
                            f"but these run at none of them: {', '.join(unplaced)}")

    # The launcher's help quotes the same counts.
    _, out = run([launcher, "matrix", "--help"])
    m = re.search(r'default: "([\d ]+)"; the scale runs of ctest: "([\d ]+)"', out)
    if not m:
        fail("rank counts", "launch/meshtest matrix --help no longer quotes its default and "
                            "ctest's scale counts (this check reads them there)")
    else:
        compare("launch/meshtest matrix --help's default vs the default counts",
                counts(m.group(1)), plain_counts - named.keys(),
                readme_name="matrix --help", registry_name="CMake's registered tests")
        compare("launch/meshtest matrix --help's scale runs vs the runs labelled scale",
                counts(m.group(2)), scale_counts,
                readme_name="matrix --help", registry_name="CMake's registered tests")
        row = re.search(r"every MPI test binary at np = ([\d, ]+)", readme)
        if not row:
            fail("rank counts", "README.md's matrix row no longer says 'every MPI test binary at "
                                "np = ...' (this check reads it there)")
        else:
            compare("README.md's matrix row vs launch/meshtest matrix's default",
                    counts(row.group(1)), counts(m.group(1)), registry_name="matrix --help")
    _, out = run([launcher, "test", "--help"])
    m = re.search(r"without the runs at ([\d, and]+) ranks", out)
    if not m:
        fail("rank counts", "launch/meshtest test --help no longer names the scale counts "
                            "(this check reads them there)")
    else:
        compare("launch/meshtest test --help's scale runs vs the runs labelled scale",
                counts(m.group(1)), scale_counts,
                readme_name="test --help", registry_name="CMake's registered tests")


def check_docs(readme, source):
    """README.md's Documentation list against the pages in docs/."""
    listed = set(re.findall(r"^- \[docs/([\w.-]+\.md)\]", "\n".join(
        section(readme, r"^## Documentation", r"^## ")), re.M))
    pages = {f for f in os.listdir(os.path.join(source, "docs")) if f.endswith(".md")}
    compare("README.md's Documentation list vs docs/", listed, pages,
            registry_name="docs/")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the meshtest source directory")
    parser.add_argument("build", help="the build directory (CMake's PROJECT_BINARY_DIR)")
    parser.add_argument("--no-bench", action="store_true", help="meshtest-bench is not built")
    parser.add_argument("--ctest", default="ctest", help="the ctest to list the tests with")
    args = parser.parse_args()
    source, build = os.path.abspath(args.source), os.path.abspath(args.build)
    launcher = os.path.join(source, "launch", "meshtest")
    with open(os.path.join(source, "README.md")) as f:
        readme = f.read()

    if args.no_bench:
        print("note: benchmarks not checked: meshtest-bench is not built (MESHTEST_BUILD_BENCH)")
    else:
        check_benchmarks(readme, launcher, build, os.path.join(build, "bin", "meshtest-bench"))
    check_subcommands(readme, launcher)
    check_programs(readme, build, not args.no_bench)
    check_rank_counts(readme, launcher, source, build, args.ctest)
    check_docs(readme, source)

    for line in failures:
        print(line)
    if failures:
        print(f"{len(failures)} difference(s): update README.md (or the launcher's help) to match "
              "the registries above")
        return 1
    print("README.md's lists match the registries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
