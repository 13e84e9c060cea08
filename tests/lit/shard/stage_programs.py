"""stage_programs.py PLAN_DIR: each pipeline stage's program in a plan.

Checks that every send has exactly one receive on its peer stage with the same
tag and byte count, and that a stage sends and receives only to and from other
stages. Prints per stage: the instruction count, the order of its sends (>)
and receives (<) of the forward (f) and backward (b) passes, and the number of
the optimizer's (scalars of the gradient norm, the learning rate). Exit 1 on a
mismatch.
"""
import json
import sys

plan = json.load(open(sys.argv[1] + "/plan.json"))
tensors, instrs = plan["tensors"], plan["instrs"]
stages = 1
for ax in plan["axes"]:
    if ax["role"] == "pipeline":
        stages *= ax["size"]
phase = "fbro"
sends, recvs, order, count = {}, {}, {s: [] for s in range(stages)}, [0] * stages
opt = [0] * stages
for i in instrs:
    s = i.get("stage", 0)
    count[s] += 1
    if i["kind"] != "collective" or i["op"] not in ("send", "recv"):
        continue
    c, nbytes = i, tensors[i["args"][0]]["bytes"]
    if c["peer"] == s or not 0 <= c["peer"] < stages:
        sys.exit(f"stage {s}: {c['op']} with peer {c['peer']}")
    key = (s, c["peer"], c["tag"]) if c["op"] == "send" else (c["peer"], s, c["tag"])
    book = sends if c["op"] == "send" else recvs
    if key in book:
        sys.exit(f"two {c['op']}s of tag {c['tag']} from stage {key[0]} to {key[1]}")
    book[key] = nbytes
    letter = phase[i.get("phase", 0)]
    if letter == "o":
        opt[s] += 1
    else:
        order[s].append(("<" if c["op"] == "recv" else ">") + letter)
if sends != recvs:
    sys.exit(f"unmatched: sends {sorted(set(sends) ^ set(recvs))[:4]}")
print(f"{len(sends)} transfers matched")
for s in range(stages):
    print(f"stage {s}: {count[s]} instructions: {' '.join(order[s])}; optimizer {opt[s]}")
