"""The planner against given layouts, under the cost model of the compiled plans.

usage: planner_vs.py TCC MODEL_ARGS... -- GPUS CLUSTER LAYOUT...
LAYOUT: a --mesh spec by name, then settings, joined by ';' (e.g.
"pp=2,dp=4,tp=1;microbatches=8;recompute=full"). Runs tcc MODEL --gpus GPUS
--cluster CLUSTER --plan=auto --emit=cost -o plan.json, and each layout with
--emit=cost -o; prints each layout's step time and whether it fits, the
planner's, and exits 1 unless the planner's plan fits and is at least as fast
(1e-9 relative) as every layout that fits."""
import json
import os
import subprocess
import sys
import tempfile


def cost(cmd, out):
    p = subprocess.run(cmd + ["--emit=cost", "-o", out], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), p.stderr))
    with open(out) as f:
        return json.load(f), p.stderr


def main():
    argv = sys.argv[1:]
    k = argv.index("--")
    tcc, model, rest = argv[0], argv[1:k], argv[k + 1:]
    gpus, cluster, layouts = rest[0], rest[1], rest[2:]
    tmp = tempfile.mkdtemp()
    best, log = cost([tcc] + model + ["--gpus", gpus, "--cluster", cluster, "--plan=auto"],
                     os.path.join(tmp, "plan.json"))
    chose = [l for l in log.splitlines() if l.startswith("plan: chose")]
    print("planner: step %.6g s, fits %s (%s)" % (best["step_time_s"], best["fits"],
                                                 chose[0].split(": ", 2)[-1] if chose else "?"))
    bad = not best["fits"]
    for i, lay in enumerate(layouts):
        parts = lay.split(";")
        cmd = [tcc] + model + ["--cluster", cluster, "--mesh", parts[0]]
        for s in parts[1:]:
            cmd += ["--set", s]
        m, _ = cost(cmd, os.path.join(tmp, "l%d.json" % i))
        faster = m["fits"] and m["step_time_s"] < best["step_time_s"] * (1 - 1e-9)
        print("layout %s: step %.6g s, fits %s%s" % (lay, m["step_time_s"], m["fits"],
                                                     ": FASTER than the planner's" if faster else ""))
        bad |= faster
    print("planner %s" % ("loses" if bad else "at least as fast as every layout that fits"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
