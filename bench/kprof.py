#!/usr/bin/env python3
"""kprof.py: the table of a bench/kprof.c profile.

    python3 bench/kprof.py PROGRAM KPROF_OUT STEPS MS_PER_STEP [TOP]

PROGRAM is the profiled executable (its symbols name the kernels: kN_OP), STEPS
the steps it ran and MS_PER_STEP its mean step time (the summary line), so that
what the kernels and GEMMs leave over is the runtime's own time. Prints the wall
time per step by op (summed over that op's kernels), per GEMM shape (with its
GFLOP/s) and the TOP (default 15) single kernels.
"""
import collections
import re
import subprocess
import sys

TRANS = {"111": "N", "112": "T", "113": "C"}


def main(argv):
    if len(argv) < 5:
        sys.exit(__doc__)
    prog, data, steps, step_ms = argv[1], argv[2], int(argv[3]), float(argv[4])
    top = int(argv[5]) if len(argv) > 5 else 15
    syms = {}
    nm = subprocess.run(["nm", prog], capture_output=True, text=True, check=True)
    for line in nm.stdout.splitlines():
        p = line.split()
        if len(p) == 3:
            syms[int(p[0], 16)] = p[2]
    ops = collections.defaultdict(lambda: [0.0, 0, 0])
    kernels, gemms = [], []
    for line in open(data):
        p = line.split()
        if p[0] == "K":
            name = syms.get(int(p[1], 16), "0x" + p[1])
            m = re.match(r"k\d+_(\w+?)\._omp_fn\.\d+$", name)
            op = ops[m.group(1) if m else name]
            op[0] += float(p[3])
            op[1] += int(p[2])
            op[2] += 1
            kernels.append((float(p[3]), name.split(".")[0], int(p[2])))
        elif p[0] == "G":
            m, n, k = map(int, p[1:4])
            shape = f"{m}x{n}x{k} {TRANS.get(p[4], p[4])}{TRANS.get(p[5], p[5])}"
            gemms.append((float(p[7]), shape, int(p[6]), 2.0 * m * n * k))
    total = step_ms / 1e3 * steps
    tk = sum(v[0] for v in ops.values())
    tg = sum(g[0] for g in gemms)

    def ms(s):
        return 1e3 * s / steps

    def pct(s):
        return 100 * s / total if total > 0 else 0

    print(f"per step: {step_ms:.0f} ms = GEMMs {ms(tg):.0f} ms ({pct(tg):.1f}%) + kernels "
          f"{ms(tk):.0f} ms ({pct(tk):.1f}%) + the rest {ms(total - tg - tk):.0f} ms")
    print(f"\n{'op':24s} {'ms/step':>9s} {'%step':>6s} {'calls/step':>10s} {'kernels':>7s}")
    for name, (s, calls, nk) in sorted(ops.items(), key=lambda x: -x[1][0]):
        print(f"{name:24s} {ms(s):9.1f} {pct(s):5.1f}% {calls / steps:10.0f} {nk:7d}")
    print(f"\n{'GEMM m x n x k, trans':28s} {'ms/step':>9s} {'%step':>6s} {'calls/step':>10s} "
          f"{'GFLOP/s':>8s}")
    for s, shape, calls, flops in sorted(gemms, reverse=True):
        print(f"{shape:28s} {ms(s):9.1f} {pct(s):5.1f}% {calls / steps:10.0f} "
              f"{flops * calls / s / 1e9 if s > 0 else 0:8.1f}")
    print(f"\n{'kernel':28s} {'ms/step':>9s} {'%step':>6s}")
    for s, name, calls in sorted(kernels, reverse=True)[:top]:
        print(f"{name:28s} {ms(s):9.1f} {pct(s):5.1f}%")


if __name__ == "__main__":
    main(sys.argv)
