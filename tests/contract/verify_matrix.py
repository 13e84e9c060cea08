"""verify_matrix.py TCC SAMPLES: the contract on every sample (make
verify-matrix; minutes, so not part of make test, which runs a subset in
tests/lit/shard/verify-modes.test): --verify (float64) and --verify=native,
small shapes, meshes 2x2, 2x1x2 and 2x2x2; one line per run,
'SAMPLE PRECISION MESH MODE: verified|FAILED: worst ..., tolerance T', and
exit 1 when any run does not verify. gpt2 and llama run as shipped (bf16)
and in f32; gpt-tiny and mlp are f32."""
import subprocess
import sys

tcc, samples = sys.argv[1], sys.argv[2]
bad = 0
shapes = {
    "mlp": "-D B=16 -D I=12 -D H=8 -D C=6",
    "gpt-tiny": "-D L=1 -D D=32 -D H=2 -D S=16 -D B=8",
    "gpt2": "-D L=1 -D D=32 -D H=2 -D S=16 -D V=64 -D B=16 --set microbatches=2",
    "llama": "-D L=1 -D D=32 -D H=2 -D KV=2 -D F=64 -D S=16 -D V=64 -D B=16 --set microbatches=2",
}
for model, shape in shapes.items():
    precisions = ["bf16", "f32"] if model in ("gpt2", "llama") else ["f32"]
    for prec in precisions:
        extra = [] if prec == "bf16" else (["--set", "precision=f32"] if model in ("gpt2", "llama") else [])
        for mesh in ("2x2", "2x1x2", "2x2x2"):
            for mode in ("--verify", "--verify=native"):
                cmd = [tcc, f"{samples}/{model}.tdl", *shape.split(), *extra, "--mesh", mesh, mode]
                r = subprocess.run(cmd, capture_output=True, text=True)
                last = [l for l in r.stdout.splitlines() if l.startswith(("verified", "FAILED"))]
                err = r.stderr.strip().splitlines()
                verdict = last[-1] if last else "no verdict: " + (err[-1] if err else "no output")
                print(f"{model} {prec} {mesh} {mode[2:]}: {verdict}", flush=True)
                bad += not verdict.startswith("verified")
sys.exit(1 if bad else 0)
