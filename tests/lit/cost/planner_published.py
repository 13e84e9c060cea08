"""The planner on every published run of tests/data/published.tsv: given the
row's model, GPU count, GPU (its cluster) and global batch, --plan=auto must
find a plan that fits and is predicted at least as fast as the published
layout compiled with its own settings (published.py), under the same cost
model. Prints, per row, the published layout's and the planner's prediction.

usage: planner_published.py TCC SAMPLES TSV OUTDIR [--rows I,J,...]
Exit 1 when the planner's plan does not fit, or is slower than a published
layout that fits. A published layout that does not fit the memory model is
reported as such: the planner is then only held to fitting."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published  # noqa: E402


def model_args(cmd):
    """The model and its -D options of a published.py command."""
    out, i = [cmd[1]], 2
    while i < len(cmd) and cmd[i] == "-D":
        out += cmd[i:i + 2]
        i += 2
    return out


def main():
    tcc, samples, tsv, outdir = sys.argv[1:5]
    only = None
    if sys.argv[5:6] == ["--rows"]:
        only = {int(x) for x in sys.argv[6].split(",")}
    bad = 0
    for i, r in enumerate(published.rows(tsv)):
        if only is not None and i not in only:
            continue
        name = "%s on %s GPUs" % (r["model"], r["gpus"])
        if r["cp"] not in ("", "1"):
            print("%s: skipped: context parallelism %s" % (name, r["cp"]))
            continue
        pub_out = os.path.join(outdir, "pub%d.json" % i)
        cmd = published.command(tcc, samples, r, pub_out, [])
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            print("%s: the published layout does not compile: %s" % (name, p.stderr[-300:]))
            bad += 1
            continue
        pub = json.load(open(pub_out))
        cluster = cmd[cmd.index("--cluster") + 1]
        plan_out = os.path.join(outdir, "plan%d.json" % i)
        q = subprocess.run([tcc] + model_args(cmd) + ["--gpus", r["gpus"], "--cluster", cluster,
                                                      "--plan=auto", "--emit=cost", "-o", plan_out],
                           capture_output=True, text=True)
        if q.returncode:
            print("%s: the planner failed: %s" % (name, q.stderr[-300:]))
            bad += 1
            continue
        plan = json.load(open(plan_out))
        chose = re.search(r"plan: chose (.*)", q.stderr).group(1)
        took = re.search(r"in ([0-9]+) ms", q.stderr).group(1)
        ok = plan["fits"] and (not pub["fits"] or plan["step_time_s"] <= pub["step_time_s"] * (1 + 1e-9))
        bad += not ok
        print("%s: published (tp %s, pp %s, dp %s) %.3f s, MFU %.1f%%, %s; planner (%s ms) %.3f s, "
              "MFU %.1f%%, %s: %s: %s" % (
                  name, r["tp"], r["pp"], r["dp"], pub["step_time_s"], 100 * pub["mfu"],
                  "fits" if pub["fits"] else "does not fit", took, plan["step_time_s"],
                  100 * plan["mfu"], "fits" if plan["fits"] else "DOES NOT FIT",
                  "as fast or faster" if ok else "SLOWER", chose))
    print("%d rows where the planner lost" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
