#!/usr/bin/env python3
"""Runs the hot-path bench against several libskv builds in turn and tables the results.

Each label names a shared library (LABEL=path/to/libskv.so, called through SKV_BENCH_LIB) or
the bench's linked-in library (LABEL=-). Every round runs the bench once per label, in turn,
so the machine's moments fall on all labels alike. Per call and label the table gives the
median of the runs' medians [their range], then the median over the runs whose `core` figure
(the bench's gauge of how much of a shared core it had) was at least --free, and over those
below --busy, with their counts. A hybrid call's cell adds the median of the bench's own
`vs full` ratios (each from a pair of rounds run back to back). The bench's other settings
pass through the environment (SKV_BENCH_ROWS=scattered: sessions take rows in a random order).

  cargo bench --bench hot_path --no-run
  scripts/hot_path_pairs.py --runs 20 --sessions 1000 before=/tmp/old/libskv.so after=target/release/libskv.so
"""

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(
    r"^(?P<op>\S.*?)\s{2,}(?P<n>\d+)\s+(?P<median>[\d.]+)\s+(?P<p50>[\d.]+)\s+(?P<p99>[\d.]+)\s+"
    r"(?P<target>\S+(?: full)?)\s+(?P<vs_c>\S+)\s+(?P<vs_full>\S+)\s+(?P<core>\S+)$"
)


def newest_bench():
    found = [p for p in glob.glob("target/release/deps/hot_path-*") if os.access(p, os.X_OK) and "." not in os.path.basename(p)]
    if not found:
        sys.exit("no bench binary: run `cargo bench --bench hot_path --no-run` first, or pass --bin")
    return max(found, key=os.path.getmtime)


def run(binary, lib, args):
    env = dict(os.environ, SKV_BENCH_SESSIONS=str(args.sessions), SKV_BENCH_CALLS=str(args.calls))
    env.pop("SKV_BENCH_LIB", None)
    if lib != "-":
        env["SKV_BENCH_LIB"] = os.path.abspath(lib)
    cmd = [binary, "--bench"] + ([args.filter] if args.filter else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = LINE.match(line.strip())
        if m and m["core"] != "-":
            vs_full = float(m["vs_full"].rstrip("x")) if m["vs_full"] != "-" else None
            rows.append((m["op"], float(m["median"]), float(m["core"]), vs_full))
    return rows


def median(values):
    return f"{statistics.median(values):.1f}" if values else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("labels", nargs="+", help="LABEL=path/to/libskv.so, or LABEL=- for the linked-in library")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=100000)
    ap.add_argument("--filter", help="the bench's own filter (a substring of the call names)")
    ap.add_argument("--free", type=float, default=9.5, help="core at least this: the core nearly ours")
    ap.add_argument("--busy", type=float, default=8.0, help="core below this: the core shared")
    ap.add_argument("--bin", help="the bench binary (default: the newest target/release/deps/hot_path-*)")
    args = ap.parse_args()
    labels = [tuple(s.split("=", 1)) for s in args.labels]
    if any(len(t) != 2 for t in labels):
        sys.exit("each label is LABEL=path/to/libskv.so or LABEL=-")
    binary = args.bin or newest_bench()
    results = {}  # (op, label) -> [(median, core)]
    ops = []
    for r in range(args.runs):
        for label, lib in labels:
            for op, med, core, vs_full in run(binary, lib, args):
                results.setdefault((op, label), []).append((med, core, vs_full))
                if op not in ops:
                    ops.append(op)
        print(f"run {r + 1}/{args.runs} done", file=sys.stderr)
    head = "| call |" + "".join(f" {l}: all [range] | free (n) | busy (n) |" for l, _ in labels)
    rows = os.environ.get("SKV_BENCH_ROWS") or "consecutive"
    print(f"{binary}, {args.sessions} sessions ({rows} rows), {args.calls} calls, {args.runs} runs per label; "
          f"free: core >= {args.free}, busy: core < {args.busy}")
    print(head)
    print("|---|" + "---|---|---|" * len(labels))
    for op in ops:
        cells = []
        for label, _ in labels:
            v = results.get((op, label), [])
            all_ = [m for m, _, _ in v]
            free = [m for m, c, _ in v if c >= args.free]
            busy = [m for m, c, _ in v if c < args.busy]
            span = f"[{min(all_):.1f}–{max(all_):.1f}]" if all_ else ""
            ratios = [r for _, _, r in v if r is not None]
            if ratios:
                span += f", vs full {statistics.median(ratios):.2f}x"
            cells.append(f" {median(all_)} {span} | {median(free)} ({len(free)}) | {median(busy)} ({len(busy)}) |")
        print(f"| {op} |" + "".join(cells))


if __name__ == "__main__":
    main()
