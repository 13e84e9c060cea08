"""Activation bytes per transformer layer against Korthikanti et al. 2022
(arXiv:2205.05198, Section 4): per layer, 34 s b h bytes of 16-bit
activations without recomputation (plus 5 a s^2 b for the attention scores,
which a tiled attention never stores), 2 s b h with full recomputation, both
divided by t under tensor and sequence parallelism.

The model's figure is the bytes one microbatch's forward saves for its
backward in layers (tcc --emit=memory -o JSON, `saved_in_layers`, stage 0),
per layer from two compiles that differ by two layers, in units of s b h.

usage: korthikanti.py TCC OUTDIR EXPECTED TOL TCC ARGS...  (ARGS without -D L)"""
import json
import subprocess
import sys


def saved(tcc, out, args, layers):
    path = "%s/l%d.json" % (out, layers)
    subprocess.run([tcc] + args + ["-D", "L=%d" % layers, "--emit=memory", "-o", path], check=True)
    return json.load(open(path))["stages"][0]["saved_in_layers"]


def define(args, name):
    for i, a in enumerate(args):
        if a == "-D" and args[i + 1].startswith(name + "="):
            return int(args[i + 1].split("=")[1])
    sys.exit("give -D %s" % name)


def main():
    tcc, out, expected, tol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    args = sys.argv[5:]
    s, b, h = define(args, "S"), define(args, "B"), define(args, "D")
    per_layer = (saved(tcc, out, args, 4) - saved(tcc, out, args, 2)) / 2
    got = per_layer / (s * b * h)
    rel = (got - expected) / expected
    print("%.2f s b h bytes per layer against %.2f: %+.1f%%, %s" % (
        got, expected, 100 * rel, "within" if abs(rel) <= tol else "outside"))
    return 0 if abs(rel) <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
