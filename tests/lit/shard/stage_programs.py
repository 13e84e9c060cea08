"""stage_programs.py PLAN_DIR: each pipeline stage's program in a plan.

Prints the number of transfers (sends), then per stage: the instruction
count, the order of its sends (>) and receives (<) of the forward (f) and
backward (b) passes, and the number of the optimizer's (scalars of the
gradient norm, the learning rate). It checks nothing: that every send has its
receive, in order, of the same size and dtype, and that the stages cannot
deadlock is proved by tcc itself for every plan it writes (plan_check_comm,
runtime/match.c; tests/unit/test_match.c).
"""
import json
import sys

plan = json.load(open(sys.argv[1] + "/plan.json"))
instrs = plan["instrs"]
stages = 1
for ax in plan["axes"]:
    if ax["role"] == "pipeline":
        stages *= ax["size"]
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
