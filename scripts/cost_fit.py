"""Fit the cost model's constants to the published runs: try each point of
a small grid (cluster-file keys, docs/cost.md) on every row of
tests/data/published.tsv and print the worst relative error of each, best
last. The constants are the same for every row and every GPU.

usage: python3 scripts/cost_fit.py [TCC] [KEY=V1:V2:... ...]
e.g.   python3 scripts/cost_fit.py ./tcc gemm_efficiency=0.68:0.72:0.76 attention_efficiency=0.2:0.25
"""
import itertools
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worst(tcc, consts, tmp):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests/lit/cost/published.py"), tcc,
                        os.path.join(ROOT, "samples"), os.path.join(ROOT, "tests/data/published.tsv"),
                        tmp, "--tol", "1", "--consts", consts], capture_output=True, text=True)
    errs = [float(e) for e in re.findall(r"\(([-+][0-9.]+)%\)", p.stdout)]
    return max(abs(e) for e in errs) if errs else float("inf"), errs


def main():
    args = sys.argv[1:]
    tcc = args.pop(0) if args and "=" not in args[0] else os.path.join(ROOT, "tcc")
    keys, grids = [], []
    for a in args:
        k, v = a.split("=", 1)
        keys.append(k)
        grids.append(v.split(":"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in itertools.product(*grids):
            consts = ",".join("%s=%s" % kv for kv in zip(keys, point))
            w, errs = worst(tcc, consts, tmp)
            results.append((w, consts, errs))
            print("%6.1f%%  %s  %s" % (w, consts, " ".join("%+.1f" % e for e in errs)), flush=True)
    results.sort(key=lambda r: -r[0])
    print("best: %.1f%% with %s" % (results[-1][0], results[-1][1]))


if __name__ == "__main__":
    main()
