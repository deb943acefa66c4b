#!/usr/bin/env python3
"""check_layers: every #include under src/ and dist/ against the layers of docs/design.md.

Usage: tools/check_layers.py [ROOT]   (ROOT: the repository, default this script's parent's)

Fails (exit 1, one report per finding with file:line and the include chain) on
  - a cycle of includes between modules (a module is a path without its extension, so a.hpp
    and a.cpp are one; a cycle of any length),
  - a file under src/ that includes a dist/ header or MPI (<mpi.h>),
  - an include against the layer order (LAYERS below, the order of docs/design.md: a layer
    includes only itself and the layers before it), or of a file outside src/ and dist/,
  - a folder under src/ or dist/ that is not in LAYERS, or LAYERS disagreeing with the folder
    list of docs/design.md,
  - an include of a plug-in folder (SEAMS: the CCLs' paths, dist/ccl/paths/<path>/) from
    outside it (the front end reaches a path only through its registry), or of one plug-in
    from another, unless PLUGIN_DEPENDENCIES lists the pair; the library's own programs
    (CONSUMERS: bench/, tools/, examples/) are held to the first rule too (a path's report
    comes from dist::path_reports). The tests may include a plug-in: they test it.
Exit 0 when all hold, 2 on bad usage. Registered in CTest as layering.includes (label unit).
"""

import re
import sys
from collections import deque
from pathlib import Path

# The layers, in the order of docs/design.md ("Each layer uses only the layers above it in
# this list"): all of src/ before all of dist/. A file belongs to the longest entry that
# prefixes its folder.
LAYERS = [
    "src/core",
    "src/perf",
    "src/ops",
    "src/models",
    "src/check",  # gpt_oss_chains counts the gpt-oss blocks of src/models
    "src/dp",
    "src/kernels",  # each version is checked with src/check's metrics and tolerance
    "src/gpu",  # device tensors and kernels, on core, perf (op timing), ops and kernels
    "dist/mesh",
    "dist/ccl",
    "dist/shard",
    "dist/perf",
    "dist/parallel",
    "dist/kernels",
    # The GPU ranks' transport: the mesh over NCCL and the CCLs' device path (on dist/ccl's
    # seam); then GPU ops sharded the CPU layers' way on it (the fp8 GPU versions over
    # dist/kernels' shard functions).
    "dist/gpu/ccl",
    "dist/gpu/parallel",
    "dist/testing",
]

# Includes allowed against the order, as (from layer, to layer): why. None today: every
# include of src/ and dist/ follows the order.
EXCEPTIONS: dict[tuple[str, str], str] = {}

# Folders of plug-ins, one sub-folder each: nothing outside a plug-in includes it (the CCLs'
# paths register themselves, dist/ccl/path_registry.hpp, so the front end names none).
SEAMS = ["dist/ccl/paths"]

# Plug-ins that build on another, as (from, to): why.
PLUGIN_DEPENDENCIES = {
    ("dist/ccl/paths/node_chain", "dist/ccl/paths/shm"):
        "the node chain reduces within each node through the shared-memory path's window",
}

# Headers of MPI, which nothing under src/ may include.
MPI_HEADERS = {"mpi.h", "mpi.hpp", "mpicxx.h"}

SOURCE_SUFFIXES = {".hpp", ".cpp", ".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
DESIGN = "docs/design.md"


# Folders of the library's own programs: they include no plug-in either.
CONSUMERS = ["bench", "tools", "examples"]


def consumer_sources(root):
    """Every C++ source and header under CONSUMERS, as repository-relative paths."""
    out = []
    for top in CONSUMERS:
        if (root / top).is_dir():
            for path in sorted((root / top).rglob("*")):
                if path.is_file() and path.suffix in SOURCE_SUFFIXES:
                    out.append(path.relative_to(root).as_posix())
    return out


def sources(root):
    """Every C++ source and header under src/ and dist/, as repository-relative paths."""
    out = []
    for top in ("src", "dist"):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and path.suffix in SOURCE_SUFFIXES:
                out.append(path.relative_to(root).as_posix())
    return out


def includes(root, rel):
    """(line, kind, path) of every #include of a file, outside /* */ comments."""
    out = []
    in_comment = False
    text = (root / rel).read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if in_comment:
            if "*/" not in line:
                continue
            line = line.split("*/", 1)[1]
            in_comment = False
        match = INCLUDE.match(line)
        if match:
            out.append((number, match.group(1), match.group(2)))
        stripped = re.sub(r"/\*.*?\*/", "", line)
        if "/*" in stripped.split("//", 1)[0]:
            in_comment = True
    return out


def resolve(root, rel, kind, name):
    """The repository-relative path a quoted include names (from the root, the project's rule,
    else from the including file's folder), or None for a system or missing header."""
    if kind != '"':
        return None
    for base in (root, (root / rel).parent):
        candidate = (base / name).resolve()
        try:
            found = candidate.relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
        if candidate.is_file():
            return found
    return None


def module(rel):
    return rel.rsplit(".", 1)[0]


def layer(rel):
    """The longest entry of LAYERS that holds rel's folder, or None."""
    folder = rel.rsplit("/", 1)[0]
    best = None
    for name in LAYERS:
        if (folder == name or folder.startswith(name + "/")) and (
            best is None or len(name) > len(best)
        ):
            best = name
    return best


def plugin(rel):
    """(seam, plug-in folder) of a path inside a plug-in folder, else None."""
    for seam in SEAMS:
        if rel.startswith(seam + "/"):
            name = rel[len(seam) + 1:].split("/", 1)[0]
            if "/" in rel[len(seam) + 1:]:
                return seam, f"{seam}/{name}"
    return None


def plugin_finding(rel, target):
    """Why rel may not include target (both repository-relative), or None."""
    to = plugin(target)
    if to is None:
        return None
    here = plugin(rel)
    if here is None:
        return (f"{to[1]} is a plug-in of {to[0]}: nothing outside it includes it (the front end "
                "reaches it through its registry)")
    if here[1] == to[1] or (here[1], to[1]) in PLUGIN_DEPENDENCIES:
        return None
    return (f"{here[1]} may not include {to[1]}: one plug-in includes another only where "
            "PLUGIN_DEPENDENCIES (tools/check_layers.py) says why")


def design_layers(root):
    """The folders docs/design.md lists under src/ and dist/, in its order, or None."""
    path = root / DESIGN
    if not path.is_file():
        return None
    listed, top = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        top_match = re.match(r"^([a-z_.]+)/\s", line)
        if top_match:
            top = top_match.group(1)
            continue
        sub_match = re.match(r"^  ([a-z_]+(?:/[a-z_]+)*)/\s", line)  # also gpu/ccl/
        if sub_match and top in ("src", "dist"):
            listed.append(f"{top}/{sub_match.group(1)}")
        elif line.startswith("```"):
            top = None
    return listed or None


def shortest_cycle(start, members, edges):
    """The shortest path start -> ... -> start inside one strongly connected component."""
    previous = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges.get(node, {})):
            if nxt == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return list(reversed(path)) + [start]
            if nxt in members and nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


def strongly_connected(nodes, edges):
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root_node in nodes:
        if root_node in index:
            continue
        work = [(root_node, iter(sorted(edges.get(root_node, {}))))]
        index[root_node] = low[root_node] = counter
        counter += 1
        stack.append(root_node)
        on_stack.add(root_node)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def check(root):
    """The findings, each a list of lines (the first names the rule)."""
    findings = []
    files = sources(root)
    rank = {name: i for i, name in enumerate(LAYERS)}
    edges = {}  # module -> {module: (file, line, included name)}, the first include seen

    listed = design_layers(root)
    if listed is None:
        findings.append([f"{DESIGN}: no folder list of src/ and dist/ found to check LAYERS "
                         "against (tools/check_layers.py reads its ``` block)"])
    elif listed != LAYERS:
        findings.append([
            f"{DESIGN} lists the layers {listed}",
            f"but tools/check_layers.py has LAYERS = {LAYERS}: make them agree",
        ])

    for rel in files:
        here = layer(rel)
        if here is None:
            findings.append([f"{rel}: its folder is in no layer of LAYERS (tools/check_layers.py;"
                             f" add it in the order of {DESIGN})"])
        for number, kind, name in includes(root, rel):
            where = f"{rel}:{number}"
            shown = f'{kind}{name}{">" if kind == "<" else chr(34)}'
            if rel.startswith("src/") and name.rsplit("/", 1)[-1] in MPI_HEADERS:
                findings.append([f"{where}: includes {shown}: nothing under src/ includes MPI"])
                continue
            target = resolve(root, rel, kind, name)
            if rel.startswith("src/") and (
                name.startswith(("dist/", "meshtest/dist/")) or (target or "").startswith("dist/")
            ):
                findings.append([f"{where}: includes {shown}: nothing under src/ includes dist/"])
                continue
            if target is None:
                continue
            if not target.startswith(("src/", "dist/")):
                findings.append([f"{where}: includes {shown}: src/ and dist/ include only "
                                 "src/ and dist/"])
                continue
            if module(target) != module(rel):
                edges.setdefault(module(rel), {}).setdefault(module(target),
                                                             (rel, number, name))
            why = plugin_finding(rel, target)
            if why is not None:
                findings.append([f"{where}: includes {shown}: {why}"])
            there = layer(target)
            if here is None or there is None or here == there:
                continue
            if rank[there] > rank[here] and (here, there) not in EXCEPTIONS:
                findings.append([
                    f"{where}: includes {shown}: {here} may not include {there}",
                    f"  (the layer order: {' < '.join(LAYERS)})",
                ])

    for rel in consumer_sources(root):
        for number, kind, name in includes(root, rel):
            target = resolve(root, rel, kind, name)
            why = plugin_finding(rel, target) if target is not None else None
            if why is not None:
                shown = f'{kind}{name}{">" if kind == "<" else chr(34)}'
                findings.append([f"{rel}:{number}: includes {shown}: {why}"])

    for component in strongly_connected(sorted(edges), edges):
        cycle = shortest_cycle(component[0], set(component), edges)
        lines = [f"include cycle: {' -> '.join(cycle)}"]
        for a, b in zip(cycle, cycle[1:]):
            rel, number, name = edges[a][b]
            lines.append(f'  {rel}:{number}: #include "{name}"')
        if len(component) > len(cycle) - 1:
            others = ", ".join(component)
            lines.append(f"  (one cycle among modules that all reach each other: {others})")
        findings.append(lines)
    return findings, len(files)


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) > 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = Path(argv[1]) if len(argv) == 2 else Path(__file__).resolve().parent.parent
    if not (root / "src").is_dir() or not (root / "dist").is_dir():
        print(f"check_layers: {root} has no src/ and dist/ (expected the repository root)",
              file=sys.stderr)
        return 2
    findings, count = check(root)
    for lines in findings:
        print("\n".join(lines))
    if findings:
        print(f"check_layers: {len(findings)} finding(s) in {count} files of src/ and dist/")
        return 1
    print(f"check_layers: {count} files of src/ and dist/ follow the layers, no include cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
