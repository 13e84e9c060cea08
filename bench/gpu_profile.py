#!/usr/bin/env python3
"""gpu_profile.py PROFILE PLAN.json [TOP]: where a step's time goes.

PROFILE is what TCC_PROFILE wrote (index, mean microseconds, label per
instruction), PLAN.json the plan it ran. Prints the TOP (default 15)
instructions by time: their share of the step, and what they achieved:
TFLOP/s for a GEMM (2 m n k batch) and for attention (4 Dh per (query,
key) pair and head, S^2 / 2 pairs causal, the backward 2.5 times that, as
the plan counts), GB/s for the rest (the bytes of every tensor they name,
once: a lower bound of their traffic). Then the time by kind of op
(the kernels' names end in their op), summed.
"""
import collections
import json
import re
import sys


def attention_flops(plan, instr):
    """The plan's count for an attention kernel: from its q tensor and name."""
    q = plan["tensors"][instr["args"][0]]
    b, s, qc = q["shape"][0], q["shape"][1], 1
    for d in q["shape"][2:]:  # [B, S, H*Dh], or [B, S, H, Dh] as a view
        qc *= d
    name = plan["kernels"][instr["kernel"]]["name"]
    f = 2.0 * 2.0 * b * s * s * qc  # 4 Dh per pair and head: 4 b s^2 (h dh)
    return f, name


def rate(flops, us):
    """FLOP/s in the unit that fits: TFLOP/s on a GPU, GFLOP/s on a CPU."""
    r = flops / (us * 1e-6)
    return "%.1f TFLOP/s" % (r / 1e12) if r >= 1e12 else "%.1f GFLOP/s" % (r / 1e9)


def main(argv):
    prof, planf = argv[1], argv[2]
    top = int(argv[3]) if len(argv) > 3 else 15
    plan = json.load(open(planf))
    rows, total = [], 0.0
    for line in open(prof):
        if line.startswith("#"):
            continue
        i, us, label = line.rstrip("\n").split("\t")
        rows.append((float(us), int(i), label))
        total += float(us)
    if not rows or total <= 0:
        sys.exit("gpu_profile: no timed instruction in " + prof)
    print("%-5s %10s %6s  %-44s %s" % ("instr", "us", "share", "what", "achieved"))
    by_op = collections.Counter()
    for us, i, label in rows:
        m = re.match(r"kernel k\d+_(\w+)", label)
        by_op[m.group(1) if m else label.split()[0]] += us
    for us, i, label in sorted(rows, reverse=True)[:top]:
        ins = plan["instrs"][i]
        what = ""
        if ins["kind"] == "gemm":
            g = ins["gemm"]
            f = 2.0 * g["m"] * g["n"] * g["k"] * max(g.get("batch", 1), 1)
            what = rate(f, us)
        elif ins["kind"] == "kernel" and plan["kernels"][ins["kernel"]]["pattern"] in (2, 3):
            f, name = attention_flops(plan, ins)
            # causal models halve it: the sample's attention is causal when its
            # name says nothing else; the backward does 2.5 times the forward
            f = f / 2 * (2.5 if plan["kernels"][ins["kernel"]]["pattern"] == 3 else 1)
            what = rate(f, us) + " (causal count)"
        elif ins["kind"] == "kernel":
            seen = set(ins["args"])
            nbytes = sum(plan["tensors"][t]["bytes"] for t in seen)
            what = "%.0f GB/s" % (nbytes / (us * 1e-6) / 1e9)
        print("%-5d %10.1f %5.1f%%  %-44s %s" % (i, us, 100 * us / total, label[:44], what))
    print("step: %.1f ms in %d instructions" % (total / 1e3, len(rows)))
    print("by op:")
    for op, us in by_op.most_common(12):
        print("  %-28s %9.1f us %5.1f%%" % (op, us, 100 * us / total))


if __name__ == "__main__":
    main(sys.argv)
