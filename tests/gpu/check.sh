#!/usr/bin/env bash
# check.sh: the checks that need a GPU, for a machine that has one (and the
# CUDA toolkit, MPI and NCCL). `make test` covers everything that runs
# without one; this script covers the rest:
#   1. build tcc, the runtime and tccnvrtc;
#   2. kernels: every sample's CUDA kernels compile with NVRTC for this GPU's
#      architecture, with no warning and no spill (tccnvrtc);
#   3. the cuda backend against the cpu backend: each sample, tiny shapes,
#      trains N steps from the same seed on both; every step's loss agrees
#      within a tolerance (f32: 1e-3 relative, the GPU's reductions run in
#      another order; bf16: 2e-2);
#   4. the contract on GPUs: mesh plans under mpirun, one process per GPU,
#      against one GPU (skipped with fewer than 2 GPUs);
#   5. the timing of a GPT-2 124M step: ms per step, tokens/s, MFU (model
#      FLOPs of a step over the time, over the GPU's peak: PEAK_TFLOPS,
#      default the dense bf16 tensor-core peak of the GPU nvidia-smi names).
# Usage: bash tests/gpu/check.sh [STEPS]   (run from the repository root)
# Prints one line per check and a table; exits 1 when any check fails.
set -uo pipefail

STEPS=${1:-20}
JOBS=$(nproc 2>/dev/null || echo 4)
OUT=$(mktemp -d /tmp/tcc-gpu-check.XXXXXX)
fails=0
say() { printf '%s\n' "$*"; }
fail() { say "FAIL: $*"; fails=$((fails + 1)); }
pass() { say "ok:   $*"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    say "check.sh: no GPU here (nvidia-smi lists none); this script is for a machine with one"
    exit 1
fi
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
NGPU=$(nvidia-smi -L | wc -l)
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
ARCH=sm_${CAP}
say "GPU: $GPU x $NGPU ($ARCH), output in $OUT"

# ---- 1. build ----
if ! make -j"$JOBS" tcc tccrun tccnvrtc >"$OUT/build.log" 2>&1; then
    fail "build (see $OUT/build.log)"
    exit 1
fi
pass "build"

# tiny shapes per sample: every kernel kind, seconds per run
declare -A SHAPE=(
    [mlp]=""
    [gpt-tiny]="-D L=2 -D D=64 -D H=4 -D S=32 -D B=8"
    [gpt2]="-D L=2 -D D=64 -D H=4 -D S=32 -D V=512 -D B=8"
    [llama]="-D L=2 -D D=64 -D H=4 -D KV=2 -D F=128 -D S=32 -D V=512 -D B=8"
)

# ---- 2. kernels for this GPU ----
for m in "${!SHAPE[@]}"; do
    # shellcheck disable=SC2086
    if ./tcc samples/$m.tdl ${SHAPE[$m]} --emit=plan -o "$OUT/$m.plan" >"$OUT/$m.plan.log" 2>&1 &&
        ./tccnvrtc --arch="$ARCH" --report="$OUT/$m.nvrtc.txt" "$OUT/$m.plan/plan.json" \
            >"$OUT/$m.nvrtc.log" 2>&1; then
        pass "kernels of $m compile for $ARCH without warnings or spills"
    else
        fail "kernels of $m for $ARCH (see $OUT/$m.nvrtc.log)"
    fi
done

# The loss column of a training log, one line per step.
losses() { sed -n 's/^step *[0-9]*\/[0-9]*  loss \([0-9.eE+-]*\).*/\1/p' "$1"; }

# Each step's loss of $1 and $2 within relative tolerance $3.
agree() {
    paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
        NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : -$2);
                  if (r > worst) worst = r }
        END { printf "%d steps, worst relative difference %.3g\n", n, worst;
              exit !(n > 0 && worst <= tol) }'
}

# ---- 3. cuda backend against cpu backend ----
for m in "${!SHAPE[@]}"; do
    for prec in f32 bf16; do
        src=samples/$m.tdl
        if [ "$prec" = bf16 ]; then
            src=$OUT/$m-bf16.tdl
            sed 's/^train {/train {\n    precision = bf16/' "samples/$m.tdl" >"$src"
        fi
        tol=1e-3
        [ "$prec" = bf16 ] && tol=2e-2
        # shellcheck disable=SC2086
        if ! ./tcc "$src" ${SHAPE[$m]} -o "$OUT/$m-$prec" >"$OUT/$m-$prec.build.log" 2>&1; then
            fail "$m $prec: build (see $OUT/$m-$prec.build.log)"
            continue
        fi
        "$OUT/$m-$prec" --device cpu --steps "$STEPS" --seed 7 >"$OUT/$m-$prec.cpu.log" 2>&1
        "$OUT/$m-$prec" --device cuda --steps "$STEPS" --seed 7 >"$OUT/$m-$prec.cuda.log" 2>&1
        if r=$(agree "$OUT/$m-$prec.cuda.log" "$OUT/$m-$prec.cpu.log" $tol); then
            pass "$m $prec: cuda tracks cpu ($r)"
        else
            fail "$m $prec: cuda against cpu: $r (logs $OUT/$m-$prec.{cpu,cuda}.log)"
        fi
    done
done

# ---- 4. the contract on several GPUs ----
if [ "$NGPU" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
    for mesh in 2x1 1x2; do
        m=gpt-tiny
        # shellcheck disable=SC2086
        ./tcc samples/$m.tdl ${SHAPE[$m]} --mesh $mesh -o "$OUT/$m-$mesh" >/dev/null 2>&1 &&
            mpirun -np 2 "$OUT/$m-$mesh" --device cuda --steps "$STEPS" --seed 7 \
                >"$OUT/$m-$mesh.log" 2>&1
        if r=$(agree "$OUT/$m-$mesh.log" "$OUT/$m-f32.cuda.log" 1e-3); then
            pass "$m on mesh $mesh (2 GPUs, NCCL) against one GPU ($r)"
        else
            fail "$m on mesh $mesh against one GPU: $r (log $OUT/$m-$mesh.log)"
        fi
    done
else
    say "skip: the mesh contract needs 2 GPUs and mpirun"
fi

# ---- 5. GPT-2 124M: one step's time ----
case "$GPU" in
*H100* | *H200* | *H800*) peak=989 ;;
*A100* | *A800*) peak=312 ;;
*L40S*) peak=362 ;;
*) peak=0 ;;
esac
PEAK_TFLOPS=${PEAK_TFLOPS:-$peak}
for prec in bf16 f32; do
    src=samples/gpt2.tdl
    if [ "$prec" = bf16 ]; then
        src=$OUT/gpt2-bf16.tdl
        sed 's/^train {/train {\n    precision = bf16/' samples/gpt2.tdl >"$src"
    fi
    if ! ./tcc "$src" -o "$OUT/gpt2-$prec" >"$OUT/gpt2-$prec.build.log" 2>&1; then
        fail "gpt2 124M $prec: build (see $OUT/gpt2-$prec.build.log)"
        continue
    fi
    "$OUT/gpt2-$prec" --device cuda --steps "$STEPS" --log-every 1 >"$OUT/gpt2-$prec.log" 2>&1
    # skip the first 3 steps (compilation, caches, allocator)
    awk -v peak="$PEAK_TFLOPS" -v prec="$prec" '
        /^step .* ms/ { n++; if (n <= 3) next;
            for (i = 1; i <= NF; i++) {
                if ($(i + 1) == "ms") ms += $i;
                if ($(i + 1) == "tok/s") tok += $i;
                if ($(i + 1) == "GFLOP/s") gf += $i } k++ }
        END { if (!k) { print "no timed steps"; exit 1 }
              mfu = peak > 0 ? sprintf("%.1f%%", gf / k / (peak * 1e3) * 100) : "n/a (set PEAK_TFLOPS)";
              printf "gpt2 124M %s: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %s\n",
                     prec, ms / k, tok / k, gf / k / 1e3, mfu }' "$OUT/gpt2-$prec.log" ||
        fail "gpt2 124M $prec: no timing (log $OUT/gpt2-$prec.log)"
done

if [ "$fails" -gt 0 ]; then
    say "$fails check(s) failed; logs in $OUT"
    exit 1
fi
say "all GPU checks passed; logs in $OUT"
