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
#      another order; bf16: 2e-2); and with CUDA graphs (the default)
#      against TCC_CUDA_GRAPHS=0: the same printed losses and norms where
#      two runs without graphs agree to the digit, else that tolerance;
#   4. the contract on GPUs: mesh plans under mpirun, one process per GPU,
#      against one GPU (skipped with fewer than 2 GPUs);
#   5. the watchdog: a kernel that never ends (TCC_TEST_GPU_HANG) is named
#      and the run ends within seconds;
#   6. the timing of a GPT-2 124M step: ms per step, tokens/s, MFU (model
#      FLOPs of a step over the time, over the GPU's peak: PEAK_TFLOPS,
#      default the dense bf16 tensor-core peak of the GPU nvidia-smi names).
# Usage: bash tests/gpu/check.sh [STEPS]   (run from the repository root)
# Prints one line per check and a table; exits 1 when any check fails.
# CHECK_OUT=DIR keeps the logs in DIR. TCC_BUNDLE=DIR runs a bundle made by
# tests/gpu/pack.sh instead of building (a GPU machine with no flex, bison,
# OpenBLAS, cJSON or OpenMPI): its executables and libraries, and the CUDA
# libraries this machine has wherever they are installed.
set -uo pipefail

STEPS=${1:-20}
JOBS=$(nproc 2>/dev/null || echo 4)
OUT=${CHECK_OUT:-$(mktemp -d /tmp/tcc-gpu-check.XXXXXX)}
mkdir -p "$OUT"
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
. "$(dirname "${BASH_SOURCE[0]}")/bundle.sh"
if [ -n "${TCC_BUNDLE:-}" ]; then
    if ! use_bundle >"$OUT/build.log" 2>&1; then
        cat "$OUT/build.log"
        fail "bundle $TCC_BUNDLE (see $OUT/build.log)"
        exit 1
    fi
    cat "$OUT/build.log"
elif ! make -j"$JOBS" tcc tccrun tccnvrtc >"$OUT/build.log" 2>&1; then
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

# Each step's loss of $1 and $2 within relative tolerance $3. The logs print
# six decimals, so a loss near zero (mlp learns its batch to 1e-4) gets the
# print's resolution besides: |a - b| <= tol * |b| + 1e-6.
agree() {
    paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
        NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; m = $2 > 0 ? $2 : -$2;
                  r = d / (m > 1e-300 ? m : 1e-300); if (r > worst) worst = r;
                  if (d > tol * m + 1e-6) bad++ }
        END { printf "%d steps, worst relative difference %.3g%s\n", n, worst,
                     bad ? sprintf(", %d over %s + 1e-6 absolute", bad, tol) : "";
              exit !(n > 0 && !bad) }'
}

# Sample $1 with training precision $2: its own precision setting changed, or
# one added to its train block.
with_precision() {
    if grep -q '^ *precision *=' "$1"; then
        sed "s/^\( *precision *= *\)[a-z0-9]*/\1$2/" "$1"
    else
        sed "s/^train {/train {\n    precision = $2/" "$1"
    fi
}

# ---- 3. cuda backend against cpu backend ----
for m in "${!SHAPE[@]}"; do
    for prec in f32 bf16; do
        src=$OUT/$m-$prec.tdl
        with_precision "samples/$m.tdl" "$prec" >"$src"
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

# ---- 3b. CUDA graphs: replayed steps give the steps queued one by one ----
# Each walk of the step is captured into a graph once and replayed
# (docs/runtime.md, "CUDA graphs"); TCC_CUDA_GRAPHS=0 queues its
# instructions one by one. Same kernels in the same order on one GPU: where
# two runs without graphs print the same losses and norms (no atomics in
# the step's sums), the graphs must print them too, digit for digit; where
# they differ (the attention backward adds dk and dv with atomics), within
# the cuda-against-cpu tolerance. No capture may fail.
strip() { sed -n 's/^\(step *[0-9]*\/[0-9]*  loss [^ ]*  lr [^ ]*  grad norm [^ ]*\).*/\1/p' "$1"; }
for m in "${!SHAPE[@]}"; do
    for prec in f32 bf16; do
        bin=$OUT/$m-$prec
        [ -x "$bin" ] || continue
        tol=1e-3
        [ "$prec" = bf16 ] && tol=2e-2
        TCC_CUDA_GRAPHS=0 "$bin" --device cuda --steps "$STEPS" --seed 7 >"$OUT/$m-$prec.eager.log" 2>&1
        TCC_CUDA_GRAPHS=0 "$bin" --device cuda --steps "$STEPS" --seed 7 >"$OUT/$m-$prec.eager2.log" 2>&1
        log=$OUT/$m-$prec.cuda.log
        if ! grep -q '^device cuda, CUDA graphs' "$log" || grep -q 'run without a CUDA graph' "$log" ||
            [ -z "$(strip "$log")" ]; then
            fail "$m $prec: no CUDA graphs, or a capture failed (log $log)"
        elif cmp -s <(strip "$OUT/$m-$prec.eager.log") <(strip "$OUT/$m-$prec.eager2.log"); then
            if cmp -s <(strip "$log") <(strip "$OUT/$m-$prec.eager.log"); then
                pass "$m $prec: CUDA graphs replay the steps of TCC_CUDA_GRAPHS=0 digit for digit"
            else
                fail "$m $prec: CUDA graphs against TCC_CUDA_GRAPHS=0 (logs $log, $OUT/$m-$prec.eager.log)"
            fi
        elif r=$(agree "$log" "$OUT/$m-$prec.eager.log" $tol); then
            pass "$m $prec: CUDA graphs track TCC_CUDA_GRAPHS=0 ($r; the step is run-dependent)"
        else
            fail "$m $prec: CUDA graphs against TCC_CUDA_GRAPHS=0: $r (logs $log, $OUT/$m-$prec.eager.log)"
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

# ---- 5. the watchdog on the GPU ----
# A kernel that never ends before instruction 5 of step 2 (TCC_TEST_GPU_HANG):
# with --timeout 2 the run must end within 10 s, exit 1, and name the range of
# instructions that holds instruction 5. (SIGKILL: on SIGTERM the program
# would wait for its step to end.)
bin=$OUT/gpt-tiny-f32
start=$(date +%s%N)
TCC_TEST_GPU_HANG=2:5 timeout -s KILL 60 "$bin" --device cuda --steps 3 --timeout 2 >"$OUT/watchdog.log" 2>&1
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
range=$(sed -n 's/.*instrs\[\([0-9]*\)\.\.\([0-9]*\)\].*/\1 \2/p' "$OUT/watchdog.log" | head -1)
if [ "$rc" = 1 ] && [ "$ms" -lt 10000 ] && grep -q 'waited 2 s for the GPU' "$OUT/watchdog.log" &&
    [ -n "$range" ] && [ "${range% *}" -le 5 ] && [ "${range#* }" -ge 5 ]; then
    pass "watchdog: a kernel that never ends, named (instrs[${range/ /..}]), exit 1 after $ms ms"
else
    fail "watchdog: exit $rc after $ms ms, range '$range' (log $OUT/watchdog.log)"
fi

# ---- 6. GPT-2 124M: one step's time ----
case "$GPU" in
*H100* | *H200* | *H800*) peak=989 ;;
*A100* | *A800*) peak=312 ;;
*L40S*) peak=362 ;;
*) peak=0 ;;
esac
PEAK_TFLOPS=${PEAK_TFLOPS:-$peak}
for prec in bf16 f32; do
    src=$OUT/gpt2-124M-$prec.tdl
    with_precision samples/gpt2.tdl "$prec" >"$src"
    if ! ./tcc "$src" -o "$OUT/gpt2-124M-$prec" >"$OUT/gpt2-124M-$prec.build.log" 2>&1; then
        fail "gpt2 124M $prec: build (see $OUT/gpt2-124M-$prec.build.log)"
        continue
    fi
    "$OUT/gpt2-124M-$prec" --device cuda --steps "$STEPS" --log-every 1 >"$OUT/gpt2-124M-$prec.log" 2>&1
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
                     prec, ms / k, tok / k, gf / k / 1e3, mfu }' "$OUT/gpt2-124M-$prec.log" ||
        fail "gpt2 124M $prec: no timing (log $OUT/gpt2-124M-$prec.log)"
done

if [ "$fails" -gt 0 ]; then
    say "$fails check(s) failed; logs in $OUT"
    exit 1
fi
say "all GPU checks passed; logs in $OUT"
