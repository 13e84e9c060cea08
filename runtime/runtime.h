/* runtime.h: the runtime's public API: run the training step of a plan on the CPU.
 * A Runtime owns one slab of memory that holds every tensor of its device's
 * pipeline stage (all of them without a pipeline) at its planned offset, and the plan's kernels
 * compiled by the system C compiler into a shared object (cached on disk by content). It borrows
 * the plan, which must outlive it. Nothing is allocated inside rt_step. */
#ifndef TCC_RUNTIME_H
#define TCC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "plan/plan.h"

typedef struct Runtime Runtime;

/* Check p (plan_check), map its zeroed slab (slab_bytes; cut to the device's
 * stage's own at rt_attach), compile or reuse its kernels
 * in cache_dir (NULL: $TCC_CACHE, else ~/.cache/tcc, else /tmp/tcc-cache-$UID)
 * and resolve every kernel symbol. NULL with a one-line message in err. */
Runtime *rt_open(const Plan *p, const char *cache_dir, char *err, size_t n);

/* A kernel as the generated C defines it: args[j] is tensor j of the call. */
typedef void (*RtKernel)(char *const *args);

/* rt_open for a program that has the plan's kernels linked in: kernels[i] is
 * the function of p->kernels[i]; nothing is compiled. */
Runtime *rt_open_linked(const Plan *p, RtKernel const *kernels, const char *cache_dir, char *err,
                        size_t n);

/* ---- devices ----
 * The CPU runs the plan's C kernels; the cuda device (runtime/gpu/) its CUDA
 * rendering, one GPU per process. On the cuda device the host keeps a mirror of
 * the slab that every host-side call (rt_tensor_data, init, inputs,
 * checkpoints) works on; rt_step moves what it needs (docs/runtime.md). */
typedef enum { RT_CPU, RT_CUDA } RtDeviceKind;

/* rt_open_linked on device kind. RT_CUDA takes the GPU of this process's
 * local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID; else
 * 0) and refuses a plan with kernels but no CUDA rendering. NULL with a message. */
Runtime *rt_open_device(const Plan *p, RtKernel const *kernels, RtDeviceKind kind,
                        const char *cache_dir, char *err, size_t n);
/* The CUDA devices this process sees (>= 1), or 0 with why there are none in
 * err ("built without CUDA" in a runtime built without the toolkit). */
int rt_cuda_devices(char *err, size_t n);
/* TCC_CUDA_GRAPHS, the cuda device's, into *on: unset, empty or 1: each walk
 * of the step is captured once into a CUDA graph and replayed (1); 0: its
 * instructions are queued one by one (0). Anything else: -1 with a message. */
int rt_cuda_graphs_setting(int *on, char *err, size_t n);
/* "cpu" or "cuda": the device rt runs on. */
const char *rt_device_name(const Runtime *rt);
/* On the cuda device: the whole slab into the host mirror (rt_tensor_data
 * does it too, but cannot report a failure). On the CPU: nothing. 0 or -1. */
int rt_sync_host(Runtime *rt, char *err, size_t n);

/* ---- the mesh (runtime/mesh.c) ----
 * A plan for a mesh of N devices runs on N ranks, each with its own Runtime.
 * A rank's coordinates follow the plan's placement (plan_coords: each axis's
 * stride; row-major, the first axis major, in a plan without one). Parameters and inputs are split as the plan says: every device
 * initialises its block of the same global values as one device would. */
typedef struct RtWorld RtWorld;

/* Join rt to the world w (collective: every rank of w calls it, same plan):
 * w's size must be the plan's device count; makes the groups the plan's
 * collectives use. 0, or -1 with a message. */
int rt_attach(Runtime *rt, RtWorld *w, char *err, size_t n);
/* The whole value of tensor t (its global shape) into global, on every rank
 * (collective when attached). 0, or -1 with a message. */
int rt_tensor_global(Runtime *rt, int t, void *global, char *err, size_t n);
/* How the rows (dim 0) of input `input` are dealt: this device reads rows of
 * data-parallel rank *rank among *ranks (0 and 1 on one device). */
int rt_data_split(const Runtime *rt, const char *input, int *rank, int *ranks);
/* Run fn on nranks threads, each with its rank's world of the threads backend
 * (the world is closed when fn returns). 0 when every fn returned 0; else -1
 * with the first failing rank's message (fn writes it into err, n bytes). */
int rt_run_threads(int nranks, int (*fn)(RtWorld *w, void *arg, char *err, size_t n), void *arg,
                   char *err, size_t n);

/* The contract check (runtime/verify.c): `steps` steps of plan `mesh` on its
 * mesh (threads backend) and of plan `one` (the same model on one device), from
 * the same parameters (seed) and random inputs; then the losses of each step
 * and, per parameter and optimizer state, the largest difference relative to
 * the tensor's largest magnitude, written to report (may be NULL). 0 when all
 * are within tol, 1 when not, -1 with a message when a run fails. */
int rt_verify(const Plan *mesh, const Plan *one, int steps, uint64_t seed, double tol,
              const char *cache_dir, FILE *report, char *err, size_t n);
/* rt_verify with a tolerance per value: tols[t] for tensor t of `one` (its
 * kept gradients, and its loss at tols[one->loss]). Judged are step 1's loss
 * and gradients, each against its own tolerance; the later losses and the
 * parameters and state after the steps are reported, not judged. */
int rt_verify_each(const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                   const double *tols, const char *cache_dir, FILE *report, char *err, size_t n);
/* The same with this process as one rank of w (mpi: every rank calls it);
 * rank 0 also runs the one-device reference, compares and reports; the other
 * ranks return 0 unless their own run fails. */
int rt_verify_world(RtWorld *w, const Plan *mesh, const Plan *one, int steps, uint64_t seed,
                    double tol, const char *cache_dir, FILE *report, char *err, size_t n);

/* Every value of step 1: plans `mesh` and `one` built with CG_KEEP_VALUES
 * (each value its own memory, nothing fused) run one step from the same
 * parameters and inputs as rt_verify; then for each tensor t of `one` whose
 * IR value (PlanTensor.value) the mesh plan holds too, with the same global
 * element count and dtype, diff[t] = max |mesh - one| over the whole value
 * (the mesh's blocks gathered) and scale[t] the largest magnitude, on either
 * side, of the elements that differ (0 when none does): an element equal to
 * the bit on both sides, such as a mask's -1e30, sets no scale. diff[t] = -1
 * for the others. A value held as partial sums on the mesh gathers wrong: the caller,
 * which has the graph, skips those. 0, or -1 with a message. */
int rt_verify_values(const Plan *mesh, const Plan *one, uint64_t seed, const char *cache_dir,
                     double *diff, double *scale, char *err, size_t n);

/* ---- memory (runtime/memory.c) ----
 * What a device really holds, for comparison with a memory model: the bytes
 * of its slab (its stage's) that lie in pages written so far, and the
 * high-water mark of the buffers it allocated besides for the step. */
typedef struct RtMemory {
    int64_t rank, stage; /* world rank (0 on one device), pipeline stage */
    uint64_t slab;       /* the stage's slab, from the plan (stage_slab_bytes) */
    uint64_t touched;    /* of those bytes, the ones in pages written so far (<= slab) */
    uint64_t buffers;    /* the most bytes of other step buffers held at once */
    uint64_t peak;       /* touched + buffers */
} RtMemory;
/* This device's numbers now (after the steps: their high-water marks). 0, or
 * -1 with a message. */
int rt_memory(Runtime *rt, RtMemory *m, char *err, size_t n);
/* "memory: rank R stage S: slab B bytes (touched T), buffers U bytes, peak P
 * bytes" and a newline, into f. */
void rt_memory_print(FILE *f, const RtMemory *m);
/* Collective when attached: every rank's line, in rank order, into out on the
 * ranks that pass one (NULL: none; world rank 0 prints for all). 0 or -1. */
int rt_memory_report(Runtime *rt, FILE *out, char *err, size_t n);

/* ---- this machine's speed (runtime/calibrate.c) ----
 * What the compiler's CPU cost model needs (docs/cost.md, "The CPU"), each
 * measured with the code the runtime runs: kernels in the generated style,
 * compiled as a plan's are (into cache_dir, as rt_open), and OpenBLAS. */
typedef struct RtCpuSpeed {
    int cores;           /* OpenMP threads a program runs (omp_get_max_threads) */
    double gemm1_gflops; /* sgemm 512^3 on one thread */
    double convert_ns;   /* a bf16 element widened to f32, or rounded back, by the GEMM wrapper */
    double op_ns;        /* a kernel's operation (load, store, arithmetic), one thread */
    double vop_ns;       /* one of a kernel whose loop runs as vectors (parallel for simd) */
    double chain_ns;     /* a step of a running sum, beyond its operation */
    double div_ns;       /* a float division or square root */
    double call_ns;      /* a call of expf (of the math library: logf, powf, fmaxf alike) */
    double tanh_ns;      /* a call of tanhf */
    double stream_gbs;   /* a kernel's tensors out of cache (bytes read and written), one thread */
    double speedup;      /* sgemm on every thread, against one */
    double loop_speedup; /* a parallel kernel's loop of arithmetic on every thread, against one */
    double stream_par_gbs; /* a parallel kernel's tensors out of cache, every thread */
    double chain64_ns;   /* a step of running sums 64 long, one after another, beyond its
                            operations (the out-of-order core overlaps a sum with the next) */
    double fork_us;      /* a parallel region that does nothing, on every thread */
    double memory_bytes; /* physical memory */
    char cpu[96];        /* /proc/cpuinfo's model name */
    char blas[64];       /* "OpenBLAS " and the core it chose */
} RtCpuSpeed;
/* Measure this machine with the OpenMP wait policy the process started with
 * (trainers run passive: runtime/train.c). 0, or -1 with a message. */
int rt_cpu_measure(RtCpuSpeed *s, const char *cache_dir, char *err, size_t n);

/* Free the slab, unload the kernels. rt may be NULL. */
void rt_close(Runtime *rt);

/* The plan rt runs. */
const Plan *rt_plan(const Runtime *rt);

/* Parameters from their init (the same values for the same seed and tensor
 * name, whatever the order of the tensors); optimizer state to zeros. On a
 * pipeline, after rt_attach: only the tensors this device's stage holds. */
void rt_init_params(Runtime *rt, uint64_t seed);
/* Dropout's row keys from seed (rt_init_params writes them too; a resumed run
 * writes them from its checkpoint's seed). */
void rt_init_keys(Runtime *rt, uint64_t seed);

/* Set the hyperparameter called name (e.g. "lr", the peak learning rate of
 * the schedule). 0, or -1 when the plan has none of that name. */
int rt_set_hyper(Runtime *rt, const char *name, double value, char *err, size_t n);

/* Copy bytes of data into the input tensor called name. data is the input's
 * whole (global) value, or on a mesh this device's rows of it (dim 0 already
 * dealt, the other dims whole); this device keeps its block. i32 ids of an input with a limit must lie in [0, limit). 0, or -1
 * with a message naming the first bad element (nothing is copied then). */
int rt_set_input(Runtime *rt, const char *name, const void *data, size_t bytes, char *err,
                 size_t n);

/* Every input at random from seed: i32 ids uniform in [0, limit) ([0, 2) with
 * no limit), floats standard normal. */
void rt_random_inputs(Runtime *rt, uint64_t seed);

/* One training step: the step number into every step tensor, then the
 * instructions of this device's pipeline stage in order (all of them without
 * a pipeline), then, with stages, the loss, lr and gradient norm broadcast
 * from their stage to every device. 0, or -1 with a message naming the
 * instruction. */
int rt_step(Runtime *rt, int64_t step, char *err, size_t n);

/* ---- a step that can stop before its update (runtime/guard.c) ----
 * rt_step is rt_step_begin then rt_step_end(rt, 1). rt_step_begin runs the
 * instructions of this device's stage up to the first that writes a parameter
 * or an optimizer state: forward, backward, the gradient norm. The caller can
 * then ask whether the loss and the norm are finite, and rt_step_end runs the
 * rest (the update) or not. Every call but rt_step_nonfinite is collective
 * when attached. */
enum { RT_BAD_LOSS = 1, RT_BAD_NORM = 2 };

/* The step's first part. 0, or -1 with a message naming the instruction. */
int rt_step_begin(Runtime *rt, int64_t step, char *err, size_t n);
/* After rt_step_begin: RT_BAD_LOSS | RT_BAD_NORM when the loss or the gradient
 * norm is a NaN or an infinity, as far as this device holds them (on a
 * pipeline, the devices of their stage), else 0. Not collective: on a mesh
 * the devices take the maximum over all of them before they go on, so that
 * every device applies the update or none. */
int rt_step_nonfinite(Runtime *rt);
/* After rt_step_nonfinite found one: the step's first part again, looking at
 * each parameter's gradient where the optimizer first reads it. *param: the
 * first parameter (tensor index, plan order) whose gradient holds a NaN or an
 * infinity on any device, or -1 (none, or the plan names no gradients:
 * codegen names them PARAM.grad). 0, or -1 with a message. */
int rt_step_blame(Runtime *rt, int *param, char *err, size_t n);
/* The rest of the step when apply is set (the update), then the outputs to
 * every device. 0, or -1 with a message. */
int rt_step_end(Runtime *rt, int apply, char *err, size_t n);
/* 1 when rt_step_begin stops before the update: the loss and the gradient
 * norm come first and no message between stages crosses the split. 0 when
 * the plan cannot be cut so; rt_step_begin then runs the whole step. */
int rt_step_holds_update(const Runtime *rt);

/* The forward instructions only (phase 0): the loss of the inputs, with no
 * gradient and no update (evaluation). 0, or -1 with a message. */
int rt_forward(Runtime *rt, char *err, size_t n);

/* The main of a generated program: options, data, the training loop, logs,
 * evaluation, checkpoints and resume (runtime/train.c). plan_json is the plan
 * embedded in the program; kernels its linked kernel functions. */
int rt_train_main(int argc, char **argv, const char *plan_json, size_t len,
                  RtKernel const *kernels);

/* The value of a rank-0 f32 or f64 tensor (NaN for any other, or for -1). */
double rt_scalar(Runtime *rt, int tensor);

/* The first byte of a tensor in the slab (NULL when tensor is out of range,
 * or on a pipeline held by another stage's devices only: plan_stage_holds).
 * On the cuda device: in the host mirror, brought up to date first (a failed
 * download is reported by the next rt_step); the device gets it back before
 * the next step. */
void *rt_tensor_data(Runtime *rt, int tensor);

/* The index of the first tensor called name, or -1. */
int rt_find_tensor(const Plan *p, const char *name);

/* bf16 and f16 from f32 by round-to-nearest-even (NaN stays NaN, overflow
 * gives infinity), and back (exact). The bf16 ones are inline: the GEMM
 * wrapper's loops run them on every element of its operands. */
static inline uint16_t rt_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays a (quiet) NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static inline float rt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
uint16_t rt_f32_to_f16(float x);
float rt_f16_to_f32(uint16_t h);

/* ---- token data (runtime/data.c; the llm.c token-file format) ----
 * A shard is a 256 x int32 little-endian header (magic 20240520, version 1,
 * token count, the rest 0) followed by that many uint16 little-endian tokens.
 * A loader reads the shards matching a glob pattern in name order (strcmp) as
 * one stream that repeats forever, so a batch may cross shard boundaries and
 * the end. A row is S+1 consecutive tokens: inputs the first S, targets the
 * last S. With K ranks the global batch at position p has R*K rows, global row
 * g starting at p + g*(S+1) (modulo the stream length); rank k takes global
 * rows k, k+K, k+2K, ... (its row r is global row r*K + k), and the next
 * global batch starts at p + R*K*(S+1). */
typedef struct DataLoader DataLoader;

/* Open and check every shard matching pattern: readable, header magic and
 * version, the file size equal to the header's count (else "truncated"), at
 * least 2 tokens, every token below vocab (the first bad one is named: file,
 * index, value). rank/ranks: this process reads rows r with r % ranks == rank
 * of each global batch (data parallelism); 0/1 for all. NULL with a message. */
DataLoader *rt_data_open(const char *pattern, int64_t vocab, int rank, int ranks, char *err,
                         size_t n);
void rt_data_close(DataLoader *d); /* d may be NULL */
/* This rank's rows of the next global batch (rows R per rank, as above) into
 * inputs and targets, both rows x seq (targets[i] = the token after inputs[i]).
 * Every rank must pass the same rows and seq. 0, or -1 with a message. */
int rt_data_next(DataLoader *d, int64_t rows, int64_t seq, int32_t *inputs, int32_t *targets,
                 char *err, size_t n);
/* The stream offset where the next global batch starts, in [0, tokens) (to
 * save in a checkpoint; the same on every rank), and back to it: a position
 * outside [0, tokens) is refused. */
int64_t rt_data_tell(const DataLoader *d);
int rt_data_seek(DataLoader *d, int64_t position, char *err, size_t n);
int64_t rt_data_tokens(const DataLoader *d); /* tokens in all shards */

/* Write count tokens (at most INT32_MAX) as one shard in the llm.c format:
 * under a temporary name, fsync'ed, then renamed to path. 0 or -1. */
int rt_data_write(const char *path, const uint16_t *tokens, int64_t count, char *err, size_t n);

/* ---- the examples of other inputs (runtime/npy.c; NumPy's .npy format) ----
 * The files matching a pattern, in name order, are one stream of examples
 * that repeats forever: a file holds an array (N, example...) in the input's
 * dtype (numpy '<f4' f32, '<f8' f64, '<i4' i32), little-endian and C order,
 * the example being the input's shape without its batch dimension. The
 * global batch at position p has R*K rows, global row g being example p + g;
 * rank k takes global rows k, k+K, ... and the next batch starts at p + R*K. */
typedef struct NpyLoader NpyLoader;

/* Open and check every file matching pattern for the input called input:
 * the magic, version, dtype, order, shape, the size (else "truncated" or "too
 * long"), and for an i32 input with limit > 0 every element in [0, limit)
 * (the first bad one named). NULL with a message naming the file. */
NpyLoader *rt_npy_open(const char *pattern, const char *input, PlanDType dt,
                       const int64_t *example, int erank, int64_t limit, int rank, int ranks,
                       char *err, size_t n);
void rt_npy_close(NpyLoader *l); /* l may be NULL */
/* This rank's rows of the next global batch into out (rows x example). */
int rt_npy_next(NpyLoader *l, int64_t rows, void *out, char *err, size_t n);
int64_t rt_npy_tell(const NpyLoader *l); /* the example where the next global batch starts */
int rt_npy_seek(NpyLoader *l, int64_t position, char *err, size_t n);
int64_t rt_npy_examples(const NpyLoader *l);

/* ---- checkpoints (runtime/ckpt.c; safetensors) ----
 * One file per checkpoint, DIR/step-00000042.safetensors, holding every
 * PT_PARAM and PT_STATE tensor under its plan name, and in the metadata the
 * model name, the plan hash, the step, the data position and the seed. It is
 * written to a temporary name, fsync'ed, renamed into place and the directory
 * fsync'ed, so a crash leaves either the old files or the complete new one. */
typedef struct CkptMeta {
    int64_t step;          /* the last completed step */
    int64_t data_position; /* rt_data_tell after that step, -1 without data */
    uint64_t seed;
} CkptMeta;

/* Save rt as dir/step-<meta->step>.safetensors (dir is created if missing; its
 * parent must exist). 0, or -1 with a message naming the call and the file
 * (the temporary file removed). Layout and protocol: docs/checkpoints.md. */
int rt_ckpt_save(Runtime *rt, const char *dir, const CkptMeta *meta, char *err, size_t n);
/* Load the newest complete checkpoint of dir into rt: 1 when one was loaded
 * (meta filled; it may be NULL), 0 when dir has none or does not exist, -1
 * with a message naming the file when the newest one cannot be used (another
 * model, another plan hash, a tensor missing or of another shape or dtype, a
 * corrupt file); rt is unchanged then. Never falls back to an older one. */
int rt_ckpt_load_latest(Runtime *rt, const char *dir, CkptMeta *meta, char *err, size_t n);
/* The parameters of a Hugging Face model directory (config.json and
 * model.safetensors, or the shards of model.safetensors.index.json) into rt,
 * each device keeping its blocks; optimizer state is left as it is. GPT-2
 * (model_type "gpt2") into a model named as samples/gpt2.tdl names it; the
 * config is checked against the plan (its shapes and its parameter H). 0, or
 * -1 with a message naming the file and what differs; rt is unchanged then.
 * runtime/hf.c. */
int rt_hf_init(Runtime *rt, const char *dir, char *err, size_t n);
/* rt's parameters as a Hugging Face GPT-2 directory dir (made if missing):
 * config.json from the plan, model.safetensors with every parameter whole
 * in F32 under transformers' names. Collective on a mesh (every parameter
 * is gathered); the writer (rank 0) writes. 0, or -1 with a message (on
 * the writer, or on every rank for a model that is not GPT-2). */
int rt_hf_export(Runtime *rt, const char *dir, int writer, char *err, size_t n);
/* After the checkpoint of `step` was written: remove dir's checkpoints of
 * earlier steps but the newest keep - 1 of them (keep >= 1; later steps are
 * not touched). 0, or -1 with a message naming the first file that could not
 * be removed (the others are still tried). Not collective: rank 0 calls it. */
int rt_ckpt_prune(const char *dir, int64_t step, int64_t keep, char *err, size_t n);

#endif
