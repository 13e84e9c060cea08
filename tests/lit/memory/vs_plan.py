"""The memory model against the plan it models: for each configuration, the
model's peak per stage (tcc --emit=memory -o JSON: one microbatch's plan
replayed over the schedule) and the largest moment of the compiled plan of
the whole step with every microbatch in it (tcc --emit=memory-plan), and
their largest relative difference.

With --categories CTOL the two must also agree on what the peak is: each
category (params, grads, optimizer, activations, temporaries, comm,
workspace, reserved) within CTOL of the stage's peak; the worst is printed.

usage: vs_plan.py TCC OUTDIR TOL [--categories CTOL] -- TCC ARGS... [-- TCC ARGS...]"""
import json
import re
import subprocess
import sys

CATEGORIES = ["params", "grads", "optimizer", "activations", "temporaries", "comm", "workspace",
              "reserved"]


def main():
    tcc, outdir, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rest, ctol = sys.argv[4:], None
    if rest[:1] == ["--categories"]:
        ctol, rest = float(rest[1]), rest[2:]
    configs, cur = [], None
    cworst, cwhere = 0.0, ""
    for a in rest:
        if a == "--":
            cur = []
            configs.append(cur)
        else:
            cur.append(a)
    worst = 0.0
    for k, args in enumerate(configs):
        out = "%s/c%d.json" % (outdir, k)
        subprocess.run([tcc] + args + ["--emit=memory", "-o", out], check=True)
        stages = json.load(open(out))["stages"]
        model = [s["peak"] for s in stages]
        text = subprocess.run([tcc] + args + ["--emit=memory-plan"], check=True,
                              capture_output=True, text=True).stdout
        plan = [float(x) for x in re.findall(r"plan peak (\d+) bytes", text)]
        for s, line in zip(stages, text.strip().split("\n")):
            got = dict((n, float(v)) for n, v in re.findall(r" ([a-z]+) (\d+)", line.split(":", 1)[1]))
            for n in CATEGORIES:
                d = abs(s[n] - got[n]) / s["peak"]
                if d > cworst:
                    cworst, cwhere = d, "config %d stage %d %s: %.0f/%.0f" % (
                        k, s["stage"], n, s[n], got[n])
        if len(plan) != len(model):
            print("config %d: %d stages in the model, %d in the plan" % (k, len(model), len(plan)))
            return 1
        diffs = [abs(a - b) / b for a, b in zip(model, plan)]
        worst = max(worst, max(diffs))
        print("config %d: %s" % (k, " ".join("%.0f/%.0f" % ab for ab in zip(model, plan))))
    print("worst relative difference %.4f: %s" % (worst, "within" if worst <= tol else "over"))
    if ctol is None:
        return 0 if worst <= tol else 1
    print("worst category difference %.4f of the peak (%s): %s" % (
        cworst, cwhere or "none", "within" if cworst <= ctol else "over"))
    return 0 if worst <= tol and cworst <= ctol else 1


if __name__ == "__main__":
    sys.exit(main())
