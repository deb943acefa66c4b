#!/usr/bin/env python3
"""ccl_vs_jax.py: meshtest's CPU collectives against JAX's in-process device emulation.

For every --np N, this script
  1. runs `mpirun -np N meshtest-bench ccl ... --json FILE` (meshtest's CCLs, each beside the
     direct MPI call, on N ranks), and reads its JSON rows;
  2. runs a child Python process with XLA_FLAGS=--xla_force_host_platform_device_count=N and
     JAX_PLATFORMS=cpu, which times the same collectives (psum, psum_scatter, all_gather,
     all_to_all under shard_map over a 1-D mesh 'x' of N emulated CPU devices, jit-compiled)
     on the same sizes, and checks their results exactly;
  3. prints one table per op and N with the bus bandwidths and their ratios, lists the ratios
     below 1.0, and (--json OUT) writes every figure to a JSON file.

Sizes and bandwidths follow meshtest-bench ccl (nccl-tests' conventions, bench/ccl_bench.hpp
layout_of and docs/ccl-bench.md): the size S is the whole tensor per device (all_reduce's
vector, all_gather's output, reduce_scatter's input, all_to_all's send buffer), rounded down
to whole elements and, but for all_reduce, to a multiple of N; algbw = S / time; busbw =
algbw * 2(N-1)/N for all_reduce and algbw * (N-1)/N for the others.

The JAX side runs in a child process because XLA reads the emulated device count once, when
jax is first imported; one child per N gives every N its own device count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

# The CCLs, in meshtest-bench ccl's order of `--op all` (bench/ccl_bench.hpp kOps).
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

# The JAX call that stands for each meshtest CCL (shown in headers and the JSON).
JAX_CALLS = {
    "all_reduce": "lax.psum",
    "all_gather": "lax.all_gather(tiled=True)",
    "reduce_scatter": "lax.psum_scatter(scatter_dimension=0, tiled=True)",
    "all_to_all": "lax.all_to_all(split_axis=0, concat_axis=0, tiled=True)",
}

ELEMENT_BYTES = 4  # float32, the only dtype the JAX side measures

# meshtest-bench ccl's options that this script sets itself: they may not follow `--`.
# (short, long) pairs; long names are checked as prefixes too, since boost::program_options
# accepts an unambiguous abbreviation of a long option.
OWNED_OPTIONS = [
    ("-b", "--minbytes"), ("-e", "--maxbytes"), ("-f", "--stepfactor"), ("-n", "--iters"),
    ("-w", "--warmup_iters"), ("-c", "--check"), ("-h", "--help"), (None, "--rounds"),
    (None, "--op"), (None, "--json"), (None, "--device"),
]
# Options that change what meshtest measures but that the JAX side does not follow (it stays
# at f32, sum, 1-D tensors): allowed after `--`, with a warning that meshtest/JAX then
# compares different work.
UNMATCHED_OPTIONS = [("-d", "--datatype"), ("-o", "--redop"), (None, "--dim"), (None, "--rows")]

EXIT_WRONG = 1    # a result was wrong (either side), as meshtest-bench ccl's exit code 1
EXIT_USAGE = 2    # bad options (argparse's own code)
EXIT_FAILED = 3   # a run could not be made or read (mpirun, meshtest-bench, the JAX child)


class Failure(Exception):
    """An error the user has to act on: printed as one message, exit code EXIT_FAILED."""


# ------------------------------------------------------------------- sizes and bandwidth


def parse_bytes(text: str) -> int:
    """"64K", "32M", "1G", "4096", "1.5M" -> bytes (powers of 1024), as meshtest-bench ccl."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgG]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected a positive byte count such as 4096, 64K, 32M or 1G; got '{text}'")
    unit = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match.group(2).lower()]
    value = float(match.group(1)) * unit
    if value <= 0 or value > (1 << 31):
        raise argparse.ArgumentTypeError(
            f"expected a byte count above 0 and at most 2G (meshtest-bench ccl's limit); "
            f"got '{text}'")
    return int(value)


def sizes_of(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """The rows' requested sizes: -b, then times -f up to -e (meshtest-bench ccl's sizes_of)."""
    sizes = []
    b = float(min_bytes)
    while b <= max_bytes * 1.0001:
        sizes.append(int(b))
        b = b * factor if factor > 1 else 2 * b + 1
    return sizes


def elements_of(op: str, size: int, p: int) -> int:
    """Elements of the whole tensor at about `size` bytes on p devices (layout_of, dim 0):
    rounded down to whole elements and, but for all_reduce, to a multiple of p (at least one
    such unit)."""
    unit = 1 if op == "all_reduce" else p
    return max(1, size // ELEMENT_BYTES // unit) * unit


def bus_factor(op: str, p: int) -> float:
    """nccl-tests' bus factor (dist/ccl/<op>.cpp bus_factor)."""
    return 2.0 * (p - 1) / p if op == "all_reduce" else (p - 1) / p


def human(nbytes: float) -> str:
    """"64 KiB", "2 MiB", "512 B", as meshtest-bench ccl prints sizes."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    if nbytes >= 1 << 10:
        return f"{nbytes / (1 << 10):g} KiB"
    return f"{nbytes:g} B"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0 (np 1 has busbw 0)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


# ------------------------------------------------------------------------ the JAX child


def jax_expected(op: str, p: int, n: int, device: int) -> Any:
    """Device `device`'s exact expected output, as float32 numpy, when device d's input
    element i (its own local index) is (d + i) % 7. n: elements of the whole tensor; b: one
    device block (n, or n / p but for all_reduce)."""
    import numpy as np

    b = n if op == "all_reduce" else n // p
    # sum over the p devices of (d + i) % 7 depends only on i % 7: seven sums, exact in f32.
    table = np.array([sum((r + d) % 7 for d in range(p)) for r in range(7)], dtype=np.int64)
    if op == "all_reduce":          # the whole reduced vector on every device
        return table[np.arange(n) % 7].astype(np.float32)
    if op == "reduce_scatter":      # block `device` of the reduced vector
        return table[(device * b + np.arange(b)) % 7].astype(np.float32)
    j = np.arange(n)
    e, k = j // b, j % b            # output position j holds element k of source device e
    if op == "all_gather":          # device e's whole input (b elements), e = 0 .. p-1
        return ((e + k) % 7).astype(np.float32)
    # all_to_all: block e of the output is block `device` of device e's input
    return ((e + device * b + k) % 7).astype(np.float32)


def jax_worker(spec_path: str) -> int:
    """The child: times the JAX collectives described by the spec file and writes the rows.
    Its environment (XLA_FLAGS, JAX_PLATFORMS) was set by the parent before this import."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    out_path, p = spec["out"], spec["np"]

    def write(result: dict) -> None:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(result, f)

    try:
        import jax
        import jax.numpy as jnp  # noqa: F401  (jax's own import check of its numpy side)
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
    except Exception as exc:  # ImportError, or a jaxlib that fails to load
        write({"absent": f"{type(exc).__name__}: {exc}"})
        return 0

    # jax.shard_map on newer JAX; jax.experimental.shard_map.shard_map on older releases.
    if hasattr(jax, "shard_map"):
        shard_map, shard_map_name = jax.shard_map, "jax.shard_map"
    else:
        from jax.experimental.shard_map import shard_map
        shard_map_name = "jax.experimental.shard_map.shard_map"

    devices = jax.devices()
    if len(devices) < p or devices[0].platform != "cpu":
        raise Failure(
            f"JAX shows {len(devices)} {devices[0].platform} device(s), not {p} CPU devices: "
            f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} did not take effect")
    mesh = Mesh(np.array(devices[:p]), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    lax = jax.lax
    bodies = {
        "all_reduce": lambda a: lax.psum(a, "x"),
        "all_gather": lambda a: lax.all_gather(a, "x", axis=0, tiled=True),
        "reduce_scatter": lambda a: lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True),
        "all_to_all": lambda a: lax.all_to_all(a, "x", 0, 0, tiled=True),
    }

    rows = []
    for op in spec["ops"]:
        # Every device's block in and out of the shard_map body is 1-D along the mesh axis.
        fn = jax.jit(shard_map(bodies[op], mesh=mesh, in_specs=PartitionSpec("x"),
                               out_specs=PartitionSpec("x")))
        for size in spec["sizes"]:
            n = elements_of(op, size, p)
            block = n if op == "all_reduce" else n // p
            local_in = block if op == "all_gather" else n

            def make_block(index: tuple, local_in: int = local_in) -> Any:
                # The global input is the p devices' inputs end to end; index picks one.
                start = index[0].start or 0
                d = start // local_in
                return ((d + np.arange(local_in)) % 7).astype(np.float32)

            x = jax.make_array_from_callback((p * local_in,), sharding, make_block)
            t, per, windows = time_jax(fn, x, spec)
            wrong = check_jax(fn, x, op, p, n) if spec["check"] else -1
            algbw = n * ELEMENT_BYTES / t / 1e9
            rows.append({"op": op, "size": size, "bytes": n * ELEMENT_BYTES,
                         "count": n if op == "all_reduce" else n // p,
                         "time_us": t * 1e6, "algbw": algbw,
                         "busbw": algbw * bus_factor(op, p), "wrong": wrong,
                         "calls_per_window": per, "windows": windows})
            del x
        jax.clear_caches()  # drop this op's compiled executables before the next op
    write({"jax_version": jax.__version__,
           "jaxlib_version": getattr(__import__("jaxlib"), "__version__", "?"),
           "shard_map": shard_map_name, "devices": len(devices),
           "device_kind": devices[0].device_kind, "rows": rows})
    return 0


def time_jax(fn: Any, x: Any, spec: dict) -> tuple[float, int, int]:
    """Seconds per call, the way meshtest-bench ccl times its calls: warm-up calls, then
    windows of at most 2 ms (at least one call) with rounds * iters calls in all, and the best
    window's average. sync 'window': a window's calls are dispatched back to back and the
    window ends when all their outputs are ready (jax.block_until_ready), so JAX's dispatch
    overlaps its execution as in ordinary use; sync 'call': every call is waited for before
    the next, as a synchronous library call is."""
    import jax

    fn(x).block_until_ready()  # compiles
    for _ in range(spec["warmup"]):
        fn(x).block_until_ready()
    t0 = time.perf_counter()
    fn(x).block_until_ready()
    estimate = time.perf_counter() - t0
    per = min(max(int(2e-3 / max(estimate, 1e-9)), 1), spec["iters"])
    windows = -(-spec["rounds"] * spec["iters"] // per)  # ceil
    best = math.inf
    for _ in range(windows):
        t0 = time.perf_counter()
        if spec["sync"] == "call":
            for _ in range(per):
                fn(x).block_until_ready()
        else:
            jax.block_until_ready([fn(x) for _ in range(per)])  # the list is freed after
        best = min(best, (time.perf_counter() - t0) / per)
    return best, per, windows


def check_jax(fn: Any, x: Any, op: str, p: int, n: int) -> int:
    """Elements of one more call's output, over all devices, that differ from the exact
    expected value."""
    import numpy as np

    y = fn(x)
    y.block_until_ready()
    wrong = 0
    for shard in y.addressable_shards:
        data = np.asarray(shard.data)
        device = (shard.index[0].start or 0) // data.shape[0]
        wrong += int(np.count_nonzero(data != jax_expected(op, p, n, device)))
    return wrong


def run_jax(p: int, args: argparse.Namespace, sizes: list[int], tmp: str) -> dict:
    """Runs the JAX child for p devices; returns its result (rows, or {"absent": why})."""
    spec_path = os.path.join(tmp, f"jax_spec_np{p}.json")
    out_path = os.path.join(tmp, f"jax_np{p}.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump({"np": p, "ops": args.ops, "sizes": sizes, "iters": args.iters,
                   "warmup": args.warmup_iters, "rounds": args.rounds, "check": args.check,
                   "sync": args.jax_sync, "out": out_path}, f)
    env = dict(os.environ)
    # Our device count replaces any the caller's XLA_FLAGS already had; other flags stay.
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "",
                   env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={p}"])
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, os.path.abspath(__file__), "--jax-worker", spec_path]
    proc = subprocess.run(cmd, env=env, check=False)
    if proc.returncode != 0 or not os.path.exists(out_path):
        raise Failure(f"the JAX run at np {p} failed (exit code {proc.returncode}; its messages "
                      f"are above): {' '.join(cmd)}")
    with open(out_path, encoding="utf-8") as f:
        result = json.load(f)
    result["xla_flags"] = env["XLA_FLAGS"]
    return result


# ------------------------------------------------------------------------ meshtest side


def cores() -> int:
    """The cores mpirun counts as slots: usable CPUs, or the physical cores when fewer
    (launch/common.bash cores)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        out = subprocess.run(["lscpu", "-p=Core,Socket"], capture_output=True, text=True,
                             check=True).stdout
        physical = len({line for line in out.splitlines() if line and not line.startswith("#")})
        if 0 < physical < n:
            n = physical
    except (OSError, subprocess.CalledProcessError):
        pass
    return n or 1


def split_passthrough(extra: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """The arguments after `--`: NAME=VALUE sets NAME in the ranks' environment; anything
    else goes to meshtest-bench ccl. Returns (env, bench args, warnings); an option this
    script sets itself is an error."""
    env, bench, warnings = {}, [], []
    for arg in extra:
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", arg):
            name, value = arg.split("=", 1)
            env[name] = value
            continue
        for short, long in OWNED_OPTIONS:
            if option_matches(arg, short, long):
                raise Failure(f"'{arg}' after '--': {short + ', ' if short else ''}{long} is set "
                              f"by this script (see --help); give it before '--'")
        for short, long in UNMATCHED_OPTIONS:
            if option_matches(arg, short, long):
                warnings.append(
                    f"'{arg}' is passed to meshtest-bench ccl only: the JAX side stays at "
                    f"float32, sum, 1-D tensors, so meshtest/JAX compares different work")
        bench.append(arg)
    return env, bench, warnings


def option_matches(arg: str, short: str | None, long: str) -> bool:
    """Whether arg names this option: -x, -xVALUE, --long, --long=VALUE, or an unambiguous
    abbreviation --lo (boost::program_options' guessing)."""
    if short and arg.startswith(short) and not arg.startswith("--"):
        return True
    if arg.startswith("--") and len(arg) > 2:
        name = arg[2:].split("=", 1)[0]
        return long[2:].startswith(name) and len(name) >= 2
    return False


def mpirun_is_open_mpi(mpirun: str) -> bool:
    """Open MPI needs -x NAME to hand an environment variable to ranks on other nodes."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout + out.stderr


def run_meshtest(p: int, args: argparse.Namespace, env_extra: dict[str, str],
                 bench_extra: list[str], tmp: str) -> dict:
    """Runs meshtest-bench ccl on p ranks; returns {"rows", "header", "command", "exit_code"}."""
    json_path = os.path.join(tmp, f"meshtest_np{p}.json")
    cmd = [args.mpirun, "-np", str(p)]
    if p > cores():
        cmd.append("--oversubscribe")
    if "OMPI_ALLOW_RUN_AS_ROOT" not in os.environ and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += args.mpirun_arg
    if env_extra and args.open_mpi:
        for name in env_extra:
            cmd += ["-x", name]
    cmd += [args.bench, "ccl", "--op", ",".join(args.ops),
            "-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", f"{args.stepfactor:g}",
            "-n", str(args.iters), "-w", str(args.warmup_iters), "--rounds", str(args.rounds),
            "-c", str(args.check), "--json", json_path] + bench_extra
    env = dict(os.environ, **env_extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if args.show_bench_output:
        sys.stdout.write(proc.stdout)
    # Exit code 1 means a wrong result: the JSON is written and its rows say which.
    if proc.returncode not in (0, 1) or not os.path.exists(json_path):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise Failure(f"meshtest-bench ccl at np {p} failed (exit code {proc.returncode}):\n"
                      f"  {' '.join(cmd)}\n{tail}")
    with open(json_path, encoding="utf-8") as f:
        rows = json.load(f)
    # The lines above the first table: np and sizes, where the ranks run, meshtest's path.
    header = []
    for line in proc.stdout.splitlines():
        if not line.startswith("#") or line.strip() == "#":  # "#" alone opens a table
            break
        header.append(line)
    return {"rows": rows, "header": header, "command": cmd, "exit_code": proc.returncode}


# --------------------------------------------------------------------------- combining


def best_rows(rows_of_runs: list[list[dict]], fields: list[tuple[str, str]]) -> list[dict]:
    """Row k of several runs of one program (--repeat): the row of the best `busbw`, with each
    (busbw field, time field) of `fields` taken from the run where that busbw was best, and
    `wrong` summed over the runs (any wrong result counts)."""
    out = []
    for rows in zip(*rows_of_runs):
        best = dict(max(rows, key=lambda r: r["busbw"]))
        for bw, t in fields:
            pick = max(rows, key=lambda r: r.get(bw) or 0.0)
            best[bw] = pick.get(bw)
            if t:
                best[t] = pick.get(t)
        checked = [r["wrong"] for r in rows if (r.get("wrong") or 0) >= 0]
        best["wrong"] = sum(checked) if checked else rows[0].get("wrong")  # < 0: unchecked
        out.append(best)
    return out


def best_run(runs: list[dict], fields: list[tuple[str, str]]) -> dict:
    """The first run's record with its rows replaced by best_rows() over every run."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    out["rows"] = best_rows([r["rows"] for r in runs], fields)
    out["repeats"] = len(runs)
    if "exit_code" in out:
        out["exit_code"] = max(r["exit_code"] for r in runs)
    return out



def combine(p: int, op: str, sizes: list[int], mt: dict | None, jx: dict | None) -> list[dict]:
    """One row per size of `op` at p: meshtest's and MPI's figures from meshtest's JSON, JAX's
    from the child's, and their ratios. Rows are matched by their place among the op's rows
    (the k-th size of the op), so a size rounded differently by -d still lines up."""
    mt_rows = [r for r in mt["rows"] if r["op"] == op] if mt else []
    jx_rows = [r for r in jx["rows"] if r["op"] == op] if jx and "rows" in jx else []
    if mt and len(mt_rows) != len(sizes):
        raise Failure(f"meshtest-bench ccl's JSON at np {p} has {len(mt_rows)} {op} rows; "
                      f"expected {len(sizes)} (sizes {sizes})")
    out = []
    for k, size in enumerate(sizes):
        m = mt_rows[k] if mt_rows else None
        j = jx_rows[k] if jx_rows else None
        memcpy = m.get("memcpy_gbps") if m else None
        row = {
            "op": op, "np": p, "size": size,
            "bytes": (m or j)["bytes"] if (m or j) else elements_of(op, size, p) * ELEMENT_BYTES,
            "meshtest": None if m is None else {
                "time_us": m["time_us"], "algbw": m["algbw"], "busbw": m["busbw"],
                "wrong": m["wrong"], "dtype": m.get("dtype"), "dim": m.get("dim"),
                "memory": m.get("memory"),
                "steps": m.get("steps"), "written_bytes": m.get("written_bytes"),
                "read_bytes": m.get("read_bytes")},
            "mpi": None if m is None else {"time_us": m["mpi_time_us"], "busbw": m["mpi_busbw"]},
            "jax": None if j is None else {
                "bytes": j["bytes"], "time_us": j["time_us"], "algbw": j["algbw"],
                "busbw": j["busbw"], "wrong": j["wrong"],
                "calls_per_window": j["calls_per_window"], "windows": j["windows"]},
            "memcpy_gbps": memcpy,
        }
        # At np 1 nothing crosses devices: every busbw is 0 and no ratio says anything.
        mb = m["busbw"] if m and p > 1 else None
        row["ratios"] = {
            "meshtest_over_jax": ratio(mb, j["busbw"] if j else None),
            "meshtest_over_mpi": ratio(mb, m["mpi_busbw"] if m else None),
            "meshtest_over_memcpy": ratio(mb, memcpy),
            "jax_over_memcpy": ratio(j["busbw"] if j and p > 1 else None, memcpy),
        }
        out.append(row)
    return out


RATIO_NAMES = {  # the ratios listed when below 1.0, in the table's words
    "meshtest_over_jax": "meshtest/JAX",
    "meshtest_over_mpi": "meshtest/MPI",
    "meshtest_over_memcpy": "busbw/memcpy",
}


def fmt_num(v: float | None, width: int, digits: int, mark_below_one: bool = False) -> str:
    """A right-aligned number, '-' when missing; ratios below 1.0 end in '*'."""
    if v is None:
        return f"{'-':>{width}}"
    text = f"{v:.{digits}f}" + ("*" if mark_below_one and v < 1.0 else " " if mark_below_one
                                else "")
    return f"{text:>{width}}"


def print_table(p: int, op: str, rows: list[dict], with_jax: bool, jax_info: str) -> None:
    """The table of one op at p: size, the three busbw, the ratios, and (all_reduce, where
    meshtest's JSON has it) memcpy and busbw/memcpy."""
    with_memcpy = any(r["memcpy_gbps"] is not None for r in rows)
    memory = next((r["meshtest"]["memory"] for r in rows if r["meshtest"]), None)
    print(f"#\n# {op} - np {p}, float32: meshtest"
          + (f" (tensors: {memory})" if memory else "") + " vs the direct MPI call"
          + (f" vs JAX {JAX_CALLS[op]} ({jax_info})" if with_jax else "")
          + "\n# busbw in GB/s; ratios are of busbw (= inverse of time), '*' marks one below 1.0")
    cols = [("size", 12, "(B)"), ("", 11, ""), ("meshtest", 9, "busbw"), ("MPI", 9, "busbw")]
    if with_jax:
        cols += [("JAX", 9, "busbw"), ("meshtest/", 10, "JAX")]
    cols += [("meshtest/", 10, "MPI")]
    if with_memcpy:
        cols += [("memcpy", 9, "(GB/s)"), ("busbw/", 9, "memcpy")]
    cols += [("#wrong", 8, "mt" + ("/jax" if with_jax else ""))]
    for line in (0, 2):
        print("#" + " ".join(f"{c[line]:>{c[1]}}" for c in cols)[1:])
    for r in rows:
        m, j, q = r["meshtest"], r["jax"], r["ratios"]
        cells = [f"{r['bytes']:>12}", f"{human(r['bytes']):>11}",
                 fmt_num(m and m["busbw"], 9, 3), fmt_num(r["mpi"] and r["mpi"]["busbw"], 9, 3)]
        if with_jax:
            cells += [fmt_num(j and j["busbw"], 9, 3),
                      fmt_num(q["meshtest_over_jax"], 10, 2, True)]
        cells += [fmt_num(q["meshtest_over_mpi"], 10, 2, True)]
        if with_memcpy:
            cells += [fmt_num(r["memcpy_gbps"], 9, 2),
                      fmt_num(q["meshtest_over_memcpy"], 9, 2, True)]
        wrong = [m["wrong"] if m else None] + ([j["wrong"] if j else None] if with_jax else [])
        cells += [f"{'/'.join('-' if w is None else 'N/A' if w < 0 else str(w) for w in wrong):>8}"]
        print(" ".join(cells))


def print_below_one(rows: list[dict]) -> None:
    """Lists, per ratio, the rows where it is below 1.0."""
    print("#\n# ratios below 1.0 (meshtest slower than the other side; busbw/memcpy is a "
          "fraction of the copy bandwidth, so below 1.0 there is the norm):")
    for key, name in RATIO_NAMES.items():
        have = [r for r in rows if r["ratios"][key] is not None]
        if not have:
            continue
        below = [r for r in have if r["ratios"][key] < 1.0]
        if not below:
            print(f"#   {name}: none of {len(have)} rows")
            continue
        items = ", ".join(f"{r['op']} np{r['np']} {human(r['bytes'])} {r['ratios'][key]:.2f}"
                          for r in below)
        print(f"#   {name}: {len(below)} of {len(have)} rows: {items}")


# ------------------------------------------------------------------------------ main


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The script's options (before `--`) and the pass-through arguments (after it)."""
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    ap = argparse.ArgumentParser(
        prog="ccl_vs_jax.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] [-- [NAME=VALUE ...] [meshtest-bench ccl args ...]]",
        description=(
            "meshtest's CPU collectives (mpirun -np N meshtest-bench ccl) beside JAX's\n"
            "in-process device emulation (shard_map over N CPU devices, from\n"
            "XLA_FLAGS=--xla_force_host_platform_device_count=N) on the same sizes, float32,\n"
            "sum: one table per op and N with meshtest's, MPI's and JAX's bus bandwidth and\n"
            "their ratios.\n\n"
            "After '--': NAME=VALUE sets NAME in the ranks' environment (e.g.\n"
            "MESHTEST_CCL_SHM=0); other arguments go to meshtest-bench ccl (e.g. --dim 1;\n"
            "the JAX side does not follow -d, -o, --dim, --rows)."),
        epilog=(
            "size: the whole tensor per device (all_reduce's vector, all_gather's output,\n"
            "reduce_scatter's input, all_to_all's send buffer), as meshtest-bench ccl and\n"
            "nccl-tests; algbw = size / time; busbw = algbw * 2(N-1)/N for all_reduce,\n"
            "(N-1)/N for the others.\n"
            "Timing, both sides: -w warm-up calls, then windows of at most 2 ms (at least one\n"
            "call) with --rounds x -n calls in all; time = the best window's average per call\n"
            "(meshtest: the slowest rank's; JAX: host wall time until every device's output\n"
            "is ready).\n"
            "Exit code: 0; 1 when a result was wrong (either side); 2 on bad options; 3 when\n"
            "a run failed.\n\n"
            "example:\n"
            "  python3 bench/ccl_vs_jax.py --np 2 4 -b 64K -e 16M --json cmp.json\n"
            "  python3 bench/ccl_vs_jax.py --np 8 --op all_reduce -- MESHTEST_CCL_SHM=0"))
    ap.add_argument("--np", type=int, nargs="+", default=[2], metavar="N",
                    help="device counts (ranks / emulated devices), one or more (default: 2)")
    ap.add_argument("-b", "--minbytes", type=parse_bytes, default=parse_bytes("64K"),
                    metavar="SIZE", help="smallest size (bytes; K, M, G) (default: 64K)")
    ap.add_argument("-e", "--maxbytes", type=parse_bytes, default=parse_bytes("64M"),
                    metavar="SIZE", help="largest size (default: 64M)")
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0,
                    help="size multiplier between rows (default: 2)")
    ap.add_argument("-n", "--iters", type=int, default=20,
                    help="timed calls per round (default: 20, as meshtest-bench ccl)")
    ap.add_argument("-w", "--warmup_iters", type=int, default=5,
                    help="untimed warm-up calls (default: 5, as meshtest-bench ccl)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of -n calls per side (default: 3, as meshtest-bench ccl)")
    ap.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                    help="verify every result exactly (default: 1)")
    ap.add_argument("--op", default="all",
                    help="ops, comma-separated: " + ", ".join(OPS) + ", or all (default: all)")
    ap.add_argument("--bench", default="build/bin/meshtest-bench", metavar="PATH",
                    help="the meshtest-bench binary (default: build/bin/meshtest-bench, from the "
                         "current directory, else from the repository root)")
    ap.add_argument("--mpirun", default="mpirun", metavar="PATH", help="mpirun to use")
    ap.add_argument("--mpirun-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for mpirun (repeat as needed)")
    ap.add_argument("--repeat", type=int, default=1, metavar="K",
                    help="run meshtest-bench and JAX K times each, alternately, and keep each "
                         "side's best figure per size (MPI's and memcpy's too; wrong results "
                         "add up): the machine's slow spells then hit both alike (default: 1)")
    ap.add_argument("--no-jax", action="store_true",
                    help="skip JAX: only the meshtest and MPI columns")
    ap.add_argument("--jax-sync", choices=("window", "call"), default="window",
                    help="window: a timing window's JAX calls are dispatched back to back and "
                         "waited for together (default); call: each call is waited for")
    ap.add_argument("--show-bench-output", action="store_true",
                    help="also print meshtest-bench ccl's own output (its tables and α-β model)")
    ap.add_argument("--json", metavar="OUT", help="write every figure to this JSON file")
    args = ap.parse_args(argv)

    def bad(msg: str) -> None:
        ap.error(msg)  # prints usage and the message, exits 2

    if any(p < 1 for p in args.np):
        bad(f"--np: device counts must be >= 1 (got {args.np})")
    if args.minbytes > args.maxbytes:
        bad(f"-b {args.minbytes} is larger than -e {args.maxbytes}")
    if args.stepfactor <= 1 and args.minbytes != args.maxbytes:
        bad(f"-f must be > 1 (got {args.stepfactor:g}) unless -b equals -e")
    if args.iters < 1 or args.rounds < 1 or args.warmup_iters < 0:
        bad("-n and --rounds must be >= 1 and -w >= 0")
    if args.repeat < 1:
        bad(f"--repeat must be >= 1 (got {args.repeat})")
    names = [s.strip() for s in args.op.split(",") if s.strip()]
    if "all" in names:
        names = list(OPS)
    unknown = [s for s in names if s not in OPS]
    if unknown or not names:
        bad(f"--op: unknown op(s) {unknown} (expected {', '.join(OPS)} or all)")
    args.ops = [o for o in OPS if o in names]  # meshtest's order, each once
    return args, extra


def find_bench(path: str) -> str:
    """--bench as given, else relative to the repository root (this file's parent dir)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for candidate in (path, os.path.join(repo, path)):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise Failure(f"meshtest-bench not found at '{path}' (nor under {repo}): build it "
                  f"(./launch/meshtest build, or make meshtest-bench in a build dir) or pass "
                  f"--bench PATH")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--jax-worker"]:  # the child process of run_jax
        return jax_worker(argv[1])
    args, extra = parse_args(argv)
    env_extra, bench_extra, warnings = split_passthrough(extra)
    args.bench = find_bench(args.bench)
    if shutil.which(args.mpirun) is None:
        raise Failure(f"'{args.mpirun}' not found: install MPI or pass --mpirun PATH")
    args.open_mpi = mpirun_is_open_mpi(args.mpirun)
    sizes = sizes_of(args.minbytes, args.maxbytes, args.stepfactor)
    for w in warnings if not args.no_jax else []:
        print(f"# warning: {w}", file=sys.stderr)

    print(f"# ccl_vs_jax: np {' '.join(map(str, args.np))}, float32 sum, sizes "
          f"{human(args.minbytes)} .. {human(args.maxbytes)} x{args.stepfactor:g}, ops "
          f"{','.join(args.ops)}; {args.warmup_iters} warm-up, {args.rounds} x {args.iters} "
          f"calls per side"
          + (f", best of {args.repeat} alternating runs per side" if args.repeat > 1 else "")
          + f"; {cores()} cores on {platform.node()}")
    use_jax = not args.no_jax
    if args.no_jax:
        print("# JAX: skipped (--no-jax)")
    jax_meta: dict = {}
    all_rows: list[dict] = []
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ccl_vs_jax.") as tmp:
        for p in args.np:
            mts: list[dict] = []
            jxs: list[dict] = []
            for k in range(args.repeat):
                of = f" ({k + 1} of {args.repeat})" if args.repeat > 1 else ""
                print(f"# np {p}: running meshtest-bench ccl{of} ...", file=sys.stderr,
                      flush=True)
                mts.append(run_meshtest(p, args, env_extra, bench_extra, tmp))
                if use_jax:
                    print(f"# np {p}: running JAX{of} ...", file=sys.stderr, flush=True)
                    jxs.append(run_jax(p, args, sizes, tmp))
                    if "absent" in jxs[-1]:
                        break
            mt = best_run(mts, [("mpi_busbw", "mpi_time_us"), ("memcpy_gbps", "")])
            for line in mt["header"]:
                print(f"# np {p}: meshtest-bench: {line.lstrip('# ')}")
            if use_jax and any(r.get("dtype") != "f32" or r.get("dim", 0) != 0
                               for r in mt["rows"]):
                print(f"# np {p}: warning: meshtest's rows are not float32 1-D; meshtest/JAX "
                      f"compares different work")
            jx = None
            if use_jax:
                jx = jxs[-1] if "absent" in jxs[-1] else best_run(jxs, [])
                if "absent" in jx:
                    print(f"# JAX is absent (import jax failed: {jx['absent']}); printing the "
                          f"meshtest and MPI columns only")
                    use_jax, jx = False, None
                else:
                    jax_meta = {k: v for k, v in jx.items() if k != "rows"}
            jax_info = (f"JAX {jax_meta.get('jax_version')}, {p} emulated CPU devices in one "
                        f"process, sync {args.jax_sync}") if jx else ""
            for op in args.ops:
                rows = combine(p, op, sizes, mt, jx)
                print_table(p, op, rows, jx is not None, jax_info)
                all_rows += rows
            runs.append({"np": p, "meshtest_command": mt["command"],
                         "meshtest_exit_code": mt["exit_code"], "meshtest_header": mt["header"],
                         "jax": None if jx is None else {k: v for k, v in jx.items()
                                                          if k != "rows"}})
            sys.stdout.flush()

    print_below_one(all_rows)
    wrong = sum(max(0, (r[s] or {}).get("wrong", 0) or 0) for r in all_rows
                for s in ("meshtest", "jax"))
    print(f"# checked: #wrong {wrong} in all" if args.check else "# results not checked (-c 0)")
    if args.json:
        out = {
            "meta": {"argv": sys.argv, "np": args.np, "sizes": sizes, "ops": args.ops,
                     "iters": args.iters, "warmup_iters": args.warmup_iters,
                     "rounds": args.rounds, "repeat": args.repeat, "check": args.check,
                     "jax_sync": args.jax_sync,
                     "bench": args.bench, "passthrough_env": env_extra,
                     "passthrough_bench_args": bench_extra, "host": platform.node(),
                     "cores": cores(), "python": platform.python_version(),
                     "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "jax": jax_meta or None, "jax_calls": JAX_CALLS},
            "runs": runs,
            "rows": all_rows,
            "below_1": [{"op": r["op"], "np": r["np"], "bytes": r["bytes"], "ratio": key,
                         "value": r["ratios"][key]}
                        for r in all_rows for key in RATIO_NAMES
                        if r["ratios"][key] is not None and r["ratios"][key] < 1.0],
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"# wrote {len(all_rows)} rows to {args.json}")
    return EXIT_WRONG if wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Failure as exc:
        print(f"ccl_vs_jax.py: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
    except KeyboardInterrupt:
        print("ccl_vs_jax.py: interrupted", file=sys.stderr)
        sys.exit(130)
