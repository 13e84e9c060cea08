"""The memory model against the CPU runtime's own measurement: for each
configuration, the model's peak per stage (tcc --emit=memory -o JSON) and
each rank's measured peak (the generated program's --report-memory: the
slab's pages the step wrote plus the high-water mark of its other buffers),
and the largest relative difference over the ranks.

usage: runtime_vs_model.py TCC OUTDIR TOL -- TCC ARGS... [-- TCC ARGS...]"""
import json
import re
import subprocess
import sys


def configs(argv):
    out, cur = [], None
    for a in argv:
        if a == "--":
            cur = []
            out.append(cur)
        else:
            cur.append(a)
    return out


def main():
    tcc, outdir, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    worst = 0.0
    for k, args in enumerate(configs(sys.argv[4:])):
        js, prog = "%s/m%d.json" % (outdir, k), "%s/p%d" % (outdir, k)
        subprocess.run([tcc] + args + ["--emit=memory", "-o", js], check=True)
        subprocess.run([tcc] + args + ["-o", prog], check=True)
        log = subprocess.run([prog, "--steps", "2", "--report-memory"], check=True,
                             capture_output=True, text=True).stdout
        model = [s["peak"] for s in json.load(open(js))["stages"]]
        seen = re.findall(r"memory: rank (\d+) stage (\d+): .* peak (\d+) bytes", log)
        if not seen:
            print("config %d: no memory lines" % k)
            return 1
        cells = []
        for rank, stage, peak in seen:
            pred, got = model[int(stage)], float(peak)
            worst = max(worst, abs(pred - got) / got)
            cells.append("%s:%.0f/%.0f" % (rank, pred, got))
        print("config %d: %s" % (k, " ".join(cells)))
    print("worst relative difference %.4f: %s" % (worst, "within" if worst <= tol else "over"))
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
