"""profile.py COST.json PROFILE [--labels] [--same-order] [--sums-to-step]:
the cost model's instructions (--emit=cost's "instructions") and a trainer's
measured ones (TCC_PROFILE) are the same: each label as many times in the
profile as the model runs it in a step (with --labels, the same labels only:
the runtime's expansion of a loop plan makes a microbatch's first sum of a
gradient part a copy); with --same-order, the same (index, label) sequence. The profile timed at least one step and every time is a number at
least 0, with a positive total. With --sums-to-step the model's instruction
times (each times its runs) add up to its step (one device, one stage: the
CPU runs its instructions one after another)."""
import collections
import json
import re
import sys

cost = json.load(open(sys.argv[1]))
rows, steps, total = [], 0, None
for line in open(sys.argv[2]):
    m = re.search(r"(\d+) steps? timed", line)
    if line.startswith("#"):
        steps = int(m.group(1)) if m else steps
        if line.startswith("# total_us"):
            total = float(line.split("\t")[1])
        continue
    index, us, label = line.rstrip("\n").split("\t", 2)
    if not float(us) >= 0:
        sys.exit("a time that is not a number at least 0: %r" % line)
    rows.append((int(index), label))
if steps < 1 or not total or total <= 0:
    sys.exit("no step timed, or no total: steps %d total %r" % (steps, total))
model = collections.Counter()
for e in cost["instructions"]:
    model[e["label"]] += e["runs"]
measured = collections.Counter(label for _, label in rows)
if "--labels" in sys.argv:
    if set(model) != set(measured):
        sys.exit("the labels differ: %s" % sorted(set(model) ^ set(measured))[:5])
elif model != measured:
    diff = (model - measured) + (measured - model)
    sys.exit("the labels differ: %s" % dict(list(diff.items())[:5]))
if "--same-order" in sys.argv:
    want = [(e["index"], e["label"]) for e in cost["instructions"]]
    if want != rows:
        sys.exit("the order differs")
if "--sums-to-step" in sys.argv:
    s = sum(e["time_s"] * e["runs"] for e in cost["instructions"])
    if abs(s - cost["step_time_s"]) > 1e-9 * cost["step_time_s"] + 1e-12:
        sys.exit("instructions add up to %r, the step is %r" % (s, cost["step_time_s"]))
print("ok %d instructions" % len(rows))
