#!/usr/bin/env python3
"""check_design_map: docs/design.md's map against the tree, so that the map cannot drift.

Usage: tools/check_design_map.py [ROOT]   (ROOT: the repository, default this script's parent's)

Fails (exit 1, one line per finding) when
  - a folder of src/, dist/, tests/, mpi_tests/, bench/ or tools/ that holds code (a C++, CUDA,
    Python, shell or CMake file) has no row in the table of "## The map", or a row names a
    folder that is gone or holds no code;
  - a program (add_executable(meshtest-<name> ...) in tools/ or bench/) has no bullet in
    "## Programs", or a bullet names a program that is gone;
  - a library target the package exports (install(TARGETS ... EXPORT ...) in cmake/install.cmake)
    has no row in the table of "## Libraries", or a row names a target that is gone.
Exit 0 when all hold, 2 on bad usage. Registered in CTest as docs.design_map (label unit).
"""

import re
import sys
from pathlib import Path

DESIGN = "docs/design.md"
TOPS = ("src", "dist", "tests", "mpi_tests", "bench", "tools")
CODE_SUFFIXES = {".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh", ".py", ".sh", ".bash", ".cmake"}


def code_folders(root):
    """Every folder under TOPS (the tops included) that directly holds a code file."""
    out = set()
    for top in TOPS:
        base = root / top
        if not base.is_dir():
            continue
        for folder in [base, *sorted(p for p in base.rglob("*") if p.is_dir())]:
            if any(f.is_file() and (f.suffix in CODE_SUFFIXES or f.name == "CMakeLists.txt")
                   for f in folder.iterdir()):
                out.add(folder.relative_to(root).as_posix())
    return out


def section(text, title):
    """The lines of the "## <title>" section, or None."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            if inside:
                break
            inside = line[3:].strip() == title
            continue
        if inside:
            lines.append(line)
    return lines if inside or lines else None


def first_cells(lines):
    """The backticked first cell of each table row ("| `x` | ..."), skipping the header."""
    out = []
    for line in lines:
        match = re.match(r"^\|\s*`([^`]+)`\s*\|", line)
        if match:
            out.append(match.group(1))
    return out


def programs(root):
    """The meshtest-<name> programs that tools/ and bench/ build."""
    out = set()
    for folder in ("tools", "bench"):
        cmake = root / folder / "CMakeLists.txt"
        if cmake.is_file():
            out.update(re.findall(r"add_executable\((meshtest-[a-z0-9-]+)", cmake.read_text()))
    return out


def exported_targets(root):
    """The targets of every install(TARGETS ... EXPORT ...) of cmake/install.cmake."""
    path = root / "cmake" / "install.cmake"
    if not path.is_file():
        return set()
    out = set()
    for match in re.finditer(r"install\(TARGETS\s+([^)]*?)\s+EXPORT\b", path.read_text()):
        out.update(match.group(1).split())
    return out


def check(root):
    text = (root / DESIGN).read_text(encoding="utf-8")
    findings = []

    folders = code_folders(root)
    rows = section(text, "The map")
    if rows is None:
        findings.append(f'{DESIGN}: no section "## The map" (a table: | `folder` | what it holds |)')
    else:
        listed = [cell.rstrip("/") for cell in first_cells(rows)]
        for folder in sorted(folders - set(listed)):
            findings.append(f"{folder}/ holds code and has no row in {DESIGN}'s map")
        for folder in sorted(set(listed) - folders):
            gone = not (root / folder).is_dir()
            findings.append(f"{DESIGN}'s map names {folder}/, which "
                            f"{'is gone' if gone else 'holds no code'}")

    built = programs(root)
    bullets = section(text, "Programs") or []
    named = set()
    for line in bullets:
        match = re.match(r"^- `(meshtest-[a-z0-9-]+)", line)
        if match:
            named.add(match.group(1))
    for program in sorted(built - named):
        findings.append(f"the program {program} has no bullet in {DESIGN}'s Programs")
    for program in sorted(named - built):
        findings.append(f"{DESIGN}'s Programs names {program}, which nothing builds")

    exported = exported_targets(root)
    table = first_cells(section(text, "Libraries") or [])
    for target in sorted(exported - set(table)):
        findings.append(f"the exported library {target} has no row in {DESIGN}'s Libraries")
    for target in sorted(set(table) - exported):
        findings.append(f"{DESIGN}'s Libraries names {target}, which the package does not export")
    return findings, len(folders), len(built), len(exported)


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) > 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = Path(argv[1]) if len(argv) == 2 else Path(__file__).resolve().parent.parent
    if not (root / DESIGN).is_file():
        print(f"check_design_map: {root} has no {DESIGN} (expected the repository root)",
              file=sys.stderr)
        return 2
    findings, folders, built, exported = check(root)
    for line in findings:
        print(line)
    if findings:
        print(f"check_design_map: {len(findings)} finding(s)")
        return 1
    print(f"check_design_map: {DESIGN} names all {folders} code folders, {built} programs and "
          f"{exported} exported libraries, and nothing that is gone")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
