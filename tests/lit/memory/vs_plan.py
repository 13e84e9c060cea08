"""The memory model against the plan it models: for each configuration, the
model's peak per stage (tcc --emit=memory -o JSON: one microbatch's plan
replayed over the schedule) and the largest moment of the compiled plan of
the whole step with every microbatch in it (tcc --emit=memory-plan), and
their largest relative difference.

usage: vs_plan.py TCC OUTDIR TOL -- TCC ARGS... [-- TCC ARGS...]"""
import json
import re
import subprocess
import sys


def main():
    tcc, outdir, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    configs, cur = [], None
    for a in sys.argv[4:]:
        if a == "--":
            cur = []
            configs.append(cur)
        else:
            cur.append(a)
    worst = 0.0
    for k, args in enumerate(configs):
        out = "%s/c%d.json" % (outdir, k)
        subprocess.run([tcc] + args + ["--emit=memory", "-o", out], check=True)
        model = [s["peak"] for s in json.load(open(out))["stages"]]
        text = subprocess.run([tcc] + args + ["--emit=memory-plan"], check=True,
                              capture_output=True, text=True).stdout
        plan = [float(x) for x in re.findall(r"plan peak (\d+) bytes", text)]
        if len(plan) != len(model):
            print("config %d: %d stages in the model, %d in the plan" % (k, len(model), len(plan)))
            return 1
        diffs = [abs(a - b) / b for a, b in zip(model, plan)]
        worst = max(worst, max(diffs))
        print("config %d: %s" % (k, " ".join("%.0f/%.0f" % ab for ab in zip(model, plan))))
    print("worst relative difference %.4f: %s" % (worst, "within" if worst <= tol else "over"))
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
