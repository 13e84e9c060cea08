"""step_flops.py PLAN.json LOG|- DEVICES L D S B V H: the FLOPs a plan and its
training log count against the formula. Model FLOPs of a GPT step are
6 N T (each weight of a matrix product, forward and two backward products,
over the T = B S tokens; N the matrix weights: per layer 12 D^2, and the
tied head V D) plus causal attention: 4 Dh flops per (query, key) pair in
the forward, 3.5 times that with the backward, S^2 / 2 pairs per head and
row. Checks plan.flops x DEVICES equals it (to 1e-9), and that each step's
logged GFLOP/s equals it over the logged ms (to the log's rounding; no log
for -). Prints 'flops agree' with the total."""
import json
import re
import sys

plan, log = sys.argv[1], sys.argv[2]
devices, L, D, S, B, V, H = (int(a) for a in sys.argv[3:10])
T, Dh = B * S, D // H
want = 6 * (L * 12 * D * D + V * D) * T + 3.5 * 4 * B * H * Dh * (S * S / 2) * L
got = json.load(open(plan))["flops"] * devices
if abs(got - want) > 1e-9 * want:
    sys.exit("plan: %.6g FLOPs a step over %d devices, the formula %.6g" % (got, devices, want))
steps = 0
for line in open(log) if log != "-" else []:
    m = re.search(r"step\s+\d+/\d+.*\s([0-9.]+) ms .*\s([0-9.]+) GFLOP/s", line)
    if not m:
        continue
    ms, gf = float(m.group(1)), float(m.group(2))
    # ms printed to 0.1, GFLOP/s to 0.01: the bound is their rounding
    lo, hi = want / ((ms + 0.05) * 1e-3) / 1e9 - 0.005, want / (max(ms - 0.05, 1e-9) * 1e-3) / 1e9 + 0.005
    if not lo <= gf <= hi:
        sys.exit("log: %s GFLOP/s at %s ms, the formula gives %.4g" % (gf, ms, want / (ms * 1e-3) / 1e9))
    steps += 1
if not steps and log != "-":
    sys.exit("log: no step line with ms and GFLOP/s in " + log)
print("flops agree: %.6g a step, %d log lines" % (want, steps))
