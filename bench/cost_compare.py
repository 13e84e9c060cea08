#!/usr/bin/env python3
"""bench/cost_compare.py: the cost model's instruction times against measured ones.

    python3 bench/cost_compare.py COST.json PROFILE [TOP]

COST.json is what `tcc ... --emit=cost -o COST.json` writes (its "instructions":
stage 0's, with predicted seconds per run and runs per step); PROFILE what a
trainer run with TCC_PROFILE=PROFILE writes (world rank 0's mean time per step
of each instruction). Both label an instruction the same way (plan_instr_label),
so the two are summed by group (a kernel's name without its number, a GEMM's
shape, a collective) and printed side by side, largest measured first: the
groups where the model is most wrong by time are the ones to look at.
"""
import json
import re
import sys
from collections import defaultdict


def group(label):
    m = re.match(r"kernel k\d+_(.*)", label)
    if m:
        return "kernel " + m.group(1)
    return label


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[2].strip())
    top = int(sys.argv[3]) if len(sys.argv) == 4 else 15
    cost = json.load(open(sys.argv[1]))
    pred, meas = defaultdict(float), defaultdict(float)
    for e in cost["instructions"]:
        pred[group(e["label"])] += e["time_s"] * e["runs"] * 1e3
    steps = None
    for line in open(sys.argv[2]):
        if line.startswith("#"):
            m = re.search(r"(\d+) steps? timed", line)
            steps = int(m.group(1)) if m else steps
            continue
        _, us, label = line.rstrip("\n").split("\t", 2)
        meas[group(label)] += float(us) * 1e-3
    if not steps:
        sys.exit(f"{sys.argv[2]}: no step was timed (run more than one step)")
    rows = sorted(set(pred) | set(meas), key=lambda g: -max(meas[g], pred[g]))
    print(f"{'group':32s} {'predicted ms':>12s} {'measured ms':>12s} {'ratio':>6s}")
    for g in rows[:top]:
        r = f"{pred[g] / meas[g]:6.2f}" if meas[g] > 0 else "     -"
        print(f"{g[:32]:32s} {pred[g]:12.2f} {meas[g]:12.2f} {r}")
    rest = rows[top:]
    if rest:
        p, m = sum(pred[g] for g in rest), sum(meas[g] for g in rest)
        print(f"{'(%d more)' % len(rest):32s} {p:12.2f} {m:12.2f} {p / m if m else 0:6.2f}")
    p, m = sum(pred.values()), sum(meas.values())
    print(f"{'all instructions':32s} {p:12.2f} {m:12.2f} {p / m if m else 0:6.2f}")


main()
