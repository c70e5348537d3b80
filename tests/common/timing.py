"""What the compare.py scripts (tests/<producer>/compare.py) share: running
wgpu-dequant and a producer in turns, each timed with GNU time's wall clock
and peak RSS, and reading back the safetensors outputs they wrote.

Imported by putting this folder on sys.path; it needs nothing beyond the
standard library.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path


def read_dir(path: Path):
    """name -> (dtype, shape, bytes) of every safetensors file in `path`."""
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        data = f.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        header.pop("__metadata__", None)
        body = data[8 + n :]
        for name, info in header.items():
            a, b = info["data_offsets"]
            tensors[name] = (info["dtype"], info["shape"], body[a:b])
    return tensors


def timed(cmd, env=None, tail=None):
    """Seconds and peak RSS (MB) of `cmd`, through GNU time, and the
    `phases:` line it printed (or ""). A failing `cmd` ends the script with
    its output (the last `tail` characters of its stderr when given)."""
    out = subprocess.run(["/usr/bin/time", "-f", "%e %M", *cmd], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        err = out.stderr if tail is None else out.stderr[-tail:]
        sys.exit(f"{cmd[0]} failed:\n{out.stdout}\n{err}")
    secs, kb = out.stderr.strip().splitlines()[-1].split()
    phases = [ln for ln in out.stderr.splitlines() if ln.startswith("phases:")]
    return float(secs), int(kb) / 1024, phases[-1] if phases else ""


def in_turns(work: Path, whos, runs: int, command, env=None, tail=None, say=True):
    """Runs each of `whos` in turns, `runs` times each, `command(who, out)`
    writing into the emptied folder `work / who`; who -> [(seconds, MB)].
    With `say`, one line a run: `run 1 ours: 1.23 s, 456 MB phases: …`."""
    times = {who: [] for who in whos}
    for i in range(runs):
        for who in times:
            out = work / who
            shutil.rmtree(out, ignore_errors=True)
            s, m, phases = timed(command(who, out), env, tail)
            times[who].append((s, m))
            if say:
                print(f"run {i + 1} {who}: {s:.2f} s, {m:.0f} MB {phases}", flush=True)
    return times


def span(xs, unit, fmt="{:.2f}"):
    """`lo–hi` of `xs` (one value when they agree), then `unit`."""
    lo, hi = min(xs), max(xs)
    return (fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}") + unit


def seconds_and_memory(times):
    """[(seconds, MB)] as two lists."""
    return [t[0] for t in times], [t[1] for t in times]


def ranges(times):
    """`1.00–1.20 s, peak RSS 450–460 MB`: one tool's runs."""
    s, m = seconds_and_memory(times)
    return f"{span(s, ' s')}, peak RSS {span(m, ' MB', '{:.0f}')}"


def ratios(ours, theirs):
    """How much faster ours is and how much of the memory it takes, over
    every pairing of the runs, and the medians' ratio."""
    s1, m1 = seconds_and_memory(ours)
    s2, m2 = seconds_and_memory(theirs)
    return (f"{min(s2) / max(s1):.1f}–{max(s2) / min(s1):.1f}x faster (worst–best pairing), "
            f"median {sorted(s2)[len(s2) // 2] / sorted(s1)[len(s1) // 2]:.1f}x; "
            f"{min(m1) / max(m2):.2f}–{max(m1) / min(m2):.2f} of the memory")
