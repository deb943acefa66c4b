#!/usr/bin/env python3
"""check_readme_tests.py — README.md's example tests are the code the suite compiles and runs.

Each README section of EXAMPLES holds one ```cpp block; the file named for it must hold that
block verbatim (after its own header comment). A block edited in one place and not the other
fails, naming the section, the file and the first line that differs; so does a section or a
file that is gone. Registered in CTest as docs.readme_tests (label unit).
Usage: check_readme_tests.py <source dir>; exit 0 when every example matches, 1 otherwise.
"""

import re
import sys
from pathlib import Path

# README section heading -> the test file that compiles its example.
EXAMPLES = {
    "A sharded test in ten lines": "mpi_tests/test_readme.cpp",
    "A sharded GPU test in ten lines": "mpi_tests/gpu/test_gpu_readme.cpp",
}


def section_block(readme: str, heading: str) -> str | None:
    """The first ```cpp block after the `## heading` line, before the next `## ` heading."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    if not m:
        return None
    block = re.search(r"^```cpp\n(.*?)^```", m.group(1), re.M | re.S)
    return block.group(1) if block else None


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(sys.argv[1])
    readme = (root / "README.md").read_text()
    failures = 0
    for heading, rel in EXAMPLES.items():
        block = section_block(readme, heading)
        path = root / rel
        if block is None:
            print(f"FAIL: README.md has no ```cpp block under '## {heading}'")
            failures += 1
            continue
        if not path.is_file():
            print(f"FAIL: {rel} (the test of README's '{heading}') is missing")
            failures += 1
            continue
        text = path.read_text()
        if block in text:
            print(f"ok: '{heading}' is {rel}")
            continue
        # The file's code: from the first line of the block's first line on.
        want = block.splitlines()
        have = text.splitlines()
        start = next((i for i, line in enumerate(have) if line == want[0]), 0)
        for n, line in enumerate(want):
            got = have[start + n] if start + n < len(have) else "<end of file>"
            if line != got:
                print(f"FAIL: README's '{heading}' differs from {rel} at its line {n + 1}:\n"
                      f"  README: {line}\n  {rel}: {got}")
                break
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
