"""Run the published layouts of tests/data/published.tsv through the memory
model (tcc --emit=memory, no step runs) and print each row's predicted peak
per device against its GPU's memory.

usage: published.py TCC SAMPLES TSV OUTDIR [EXTRA TCC ARGS...]
Each row is compiled with its own layers, hidden size, heads, sequence, global
batch, and tensor x pipeline x data layout; microbatches of one sequence
(global batch / data ranks of them); interleaved 1F1B with two chunks per
rank on pipelines; full recomputation and ZeRO-1 (a distributed optimizer);
bf16, as the samples train; the Llama rows with sequence parallelism, as
Llama 3 trains with tensor parallelism (the GPT rows predate it). A row with context parallelism is reported as
skipped: the samples have no context axis. Exit 1 when a row does not fit or
does not compile."""
import json
import os
import subprocess
import sys

GIB = 1024.0 ** 3


def rows(path):
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f if not l.startswith("#")]
    head = lines[0].split("\t")
    return [dict(zip(head, l.split("\t"))) for l in lines[1:] if l]


def command(tcc, samples, r, out, extra):
    L, D, H, S, B = r["layers"], r["hidden"], r["heads"], r["seq"], int(r["global_batch"])
    tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
    if r["model"].startswith("Llama"):
        model = [os.path.join(samples, "llama.tdl"), "-D", "KV=8", "-D", "F=53248",
                 "-D", "V=128256"]
    else:
        model = [os.path.join(samples, "gpt2.tdl"), "-D", "V=51200"]
    cmd = [tcc] + model + ["-D", "L=" + L, "-D", "D=" + D, "-D", "H=" + H, "-D", "S=" + S,
                           "-D", "B=%d" % B, "--mesh", "dp=%d,tp=%d,pp=%d" % (dp, tp, pp),
                           "--gpu", r["gpu"], "--set", "microbatches=%d" % (B // dp),
                           "--set", "recompute=full", "--set", "zero=1"]
    if pp > 1:
        cmd += ["--set", "schedule=interleaved", "--set", "virtual_stages=2"]
    if r["model"].startswith("Llama") and tp > 1:
        cmd += ["--set", "sequence_parallel=true"]
    return cmd + extra + ["--emit=memory", "-o", out]


def main():
    tcc, samples, tsv, outdir = sys.argv[1:5]
    extra = sys.argv[5:]
    bad = 0
    for i, r in enumerate(rows(tsv)):
        name = "%s on %s GPUs (tp %s, pp %s, dp %s)" % (r["model"], r["gpus"], r["tp"], r["pp"],
                                                        r["dp"])
        if r["cp"] not in ("", "1"):
            print("%s: skipped: context parallelism %s" % (name, r["cp"]))
            continue
        out = os.path.join(outdir, "row%d.json" % i)
        p = subprocess.run(command(tcc, samples, r, out, extra), capture_output=True, text=True)
        if p.returncode != 0 and not os.path.exists(out):
            print("%s: does not compile: %s" % (name, p.stderr.strip().splitlines()[:3]))
            bad += 1
            continue
        with open(out) as f:
            m = json.load(f)
        fits = m["peak"] <= m["budget"]
        print("%s: peak %.2f GiB (stage %d) of %.2f GiB less %.2f GiB of headroom: %s" % (
            name, m["peak"] / GIB, m["peak_stage"], (m["budget"] + m["headroom"]) / GIB,
            m["headroom"] / GIB, "fits" if fits else "does not fit"))
        bad += not fits
    print("%d rows over budget or not compiled" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
