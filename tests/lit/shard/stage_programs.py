"""stage_programs.py PLAN_DIR: each pipeline stage's program in a plan (a
loop plan's expanded: every microbatch's pieces).

Prints the number of transfers (sends), then per stage: the instruction
count, the order of its sends (>) and receives (<) of the forward (f) and
backward (b) passes, and the number of the optimizer's (scalars of the
gradient norm, the learning rate). It checks nothing: that every send has its
receive, in order, of the same size and dtype, and that the stages cannot
deadlock is proved by tcc itself for every plan it writes (plan_check_comm,
plan/comm_match.c; tests/unit/test_match.c).
"""
import json
import sys

plan = json.load(open(sys.argv[1] + "/plan.json"))
stages = 1
for ax in plan["axes"]:
    if ax["role"] == "pipeline":
        stages *= ax["size"]


def program(plan):
    """The instructions each stage runs: a loop plan (docs/plan.md) as its
    schedule table makes them (the prologue, each entry's piece for its
    microbatch, the epilogue; plan/expand.c also puts each channel's
    receives in the order of its sends, which these schedules need not)."""
    instrs = plan["instrs"]
    if "sched" not in plan:
        return instrs
    k, t = plan["microbatches"], plan["sched"]
    out = []
    for s in range(stages):
        mine = [i for i in instrs if i.get("stage", 0) == s]
        out += [i for i in mine if i.get("piece", 0) == 0]
        for e in range(0, len(t), 3):
            if t[e] != s:
                continue
            piece, mb = t[e + 1], t[e + 2]
            for i in mine:
                when = i.get("when", 0)
                if i.get("piece", 0) == piece and (when == 0 or (when == 1 and mb == k - 1)
                                                   or (when == 2 and mb == 0)):
                    out.append(i)
        out += [i for i in mine if i.get("piece", 0) == -1]
    return out


instrs = program(plan)
phase = "fbro"
sends, order, count = 0, {s: [] for s in range(stages)}, [0] * stages
opt = [0] * stages
for i in instrs:
    s = i.get("stage", 0)
    count[s] += 1
    if i["kind"] != "collective" or i["op"] not in ("send", "recv"):
        continue
    sends += i["op"] == "send"
    letter = phase[i.get("phase", 0)]
    if letter == "o":
        opt[s] += 1
    else:
        order[s].append(("<" if i["op"] == "recv" else ">") + letter)
print(f"{sends} transfers")
for s in range(stages):
    print(f"stage {s}: {count[s]} instructions: {' '.join(order[s])}; optimizer {opt[s]}")
