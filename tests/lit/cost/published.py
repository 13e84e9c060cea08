"""Predict every published run of tests/data/published.tsv with the cost model
(tcc --emit=cost, no step runs) and compare with its published utilization.

usage: published.py TCC SAMPLES TSV OUTDIR [--tol X] [--consts K=V,...] [EXTRA TCC ARGS...]
Each row is compiled with its own layers, hidden size, heads, sequence,
global batch and layout, on its own cluster (DGX A100 for the GPT rows, H100
servers with RoCE for Llama), the mesh given as Megatron lays it out
(pipeline outermost, then data, tensor innermost) and placed by tcc (tensor
innermost, then by traffic: docs/cost.md, "Ranks"; past the tensor axis
every group crosses servers either way). Microbatches of one sequence; interleaved 1F1B with two chunks per
rank on pipelines. The GPT rows (Narayanan et al. 2021) train with full
recomputation and publish hardware TFLOP/s per GPU (recomputation counted):
compared with tflops_per_gpu. The Llama rows train without recomputation,
with sequence parallelism and a sharded optimizer, and publish MFU: compared
with mfu. A context-parallel row is skipped (no context axis). Exit 1 when a
row is off by more than the tolerance (relative, default 0.10). --consts
replaces the clusters' fitted constants (cluster-file keys, docs/cost.md), as
scripts/cost_fit.py does to fit them."""
import json
import os
import subprocess
import sys


def _memory_published():
    """tests/lit/memory/published.py, whose reader of the table this shares
    (loaded under a name of its own: this file is `published` too)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "memory", "published.py")
    spec = importlib.util.spec_from_file_location("memory_published", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


rows = _memory_published().rows


def chunks(r):
    """Model chunks per pipeline rank: the most, up to 8, that split the
    rank's layers evenly (Llama 3: 8, one layer each, the embedding and the
    head in place of a layer on the first and last rank)."""
    L, pp = int(r["layers"]), int(r["pp"])
    if L % pp:
        return 8
    return max(v for v in range(1, 9) if (L // pp) % v == 0)


GPUS = {"dgx-a100": "a100-80gb", "h100-roce": "h100-sxm"}


def cluster_arg(cluster, consts, outdir):
    """The named cluster, or a file of it with other constants."""
    if not consts:
        return cluster
    path = os.path.join(outdir, cluster + ".cluster")
    with open(path, "w") as f:
        f.write("gpu = %s\n" % GPUS[cluster])
        for kv in consts.split(","):
            f.write(kv.replace("=", " = ") + "\n")
    return path


def command(tcc, samples, r, out, extra, consts=""):
    L, D, H, S, B = r["layers"], r["hidden"], r["heads"], r["seq"], int(r["global_batch"])
    tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
    llama = r["model"].startswith("Llama")
    if llama:
        model = [os.path.join(samples, "llama.tdl"), "-D", "KV=8", "-D", "F=53248",
                 "-D", "V=128256"]
        cluster = "h100-roce"
    else:
        model = [os.path.join(samples, "gpt2.tdl"), "-D", "V=51200"]
        cluster = "dgx-a100"
    cmd = [tcc] + model + ["-D", "L=" + L, "-D", "D=" + D, "-D", "H=" + H, "-D", "S=" + S,
                           "-D", "B=%d" % B, "--mesh", "pp=%d,dp=%d,tp=%d" % (pp, dp, tp),
                           "--cluster", cluster_arg(cluster, consts, os.path.dirname(out)),
                           "--set", "microbatches=%d" % (B // dp)]
    if llama:
        cmd += ["--set", "recompute=none", "--set", "zero=1"]
        if tp > 1:
            cmd += ["--set", "sequence_parallel=true"]
    else:  # Megatron-LM of 2021 added each microbatch's gradient into main_grad
        cmd += ["--set", "recompute=full", "--set", "grad_accumulation_fusion=false"]
    if pp > 1:
        cmd += ["--set", "schedule=interleaved", "--set", "virtual_stages=%d" % chunks(r)]
    return cmd + extra + ["--emit=cost", "-o", out]


def main():
    tcc, samples, tsv, outdir = sys.argv[1:5]
    extra = sys.argv[5:]
    tol, consts = 0.10, ""
    if extra[:1] == ["--tol"]:
        tol, extra = float(extra[1]), extra[2:]
    if extra[:1] == ["--consts"]:
        consts, extra = extra[1], extra[2:]
    bad, worst = 0, 0.0
    for i, r in enumerate(rows(tsv)):
        name = "%s on %s GPUs (tp %s, pp %s, dp %s)" % (r["model"], r["gpus"], r["tp"], r["pp"],
                                                        r["dp"])
        if r["cp"] not in ("", "1"):
            print("%s: skipped: context parallelism %s" % (name, r["cp"]))
            continue
        out = os.path.join(outdir, "row%d.json" % i)
        p = subprocess.run(command(tcc, samples, r, out, extra, consts), capture_output=True,
                           text=True)
        if p.returncode != 0:
            print("%s: does not compile: %s" % (name, p.stderr.strip().splitlines()[:3]))
            bad += 1
            continue
        with open(out) as f:
            m = json.load(f)
        if r["model"].startswith("Llama"):
            what, pred, pub = "MFU %", 100 * m["mfu"], float(r["mfu"])
        else:
            what, pred, pub = "TFLOP/s per GPU", m["tflops_per_gpu"], float(r["tflops"])
        err = pred / pub - 1
        worst = max(worst, abs(err))
        ok = abs(err) <= tol
        bad += not ok
        print("%s: %s predicted %.1f published %.1f (%+.1f%%), step %.3f s, MFU %.1f%%, "
              "peak %.1f GiB: %s" % (name, what, pred, pub, 100 * err, m["step_time_s"],
                                     100 * m["mfu"], m["peak_memory_bytes"] / 2 ** 30,
                                     "within" if ok else "OFF"))
    print("worst %.1f%%, %d rows off by more than %.0f%% or not compiled" % (100 * worst, bad,
                                                                           100 * tol))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
