/* plan.h: the plan, the one thing the compiler hands the runtime.
 * A plan holds what one training step needs and nothing else: the tensors
 * (parameters, optimizer state, inputs, temporaries) at offsets in one slab of
 * memory, the instruction list of the step (kernel launches, GEMMs, copies),
 * the source of the kernels, and a hash. It is stored as JSON (docs/plan.md);
 * the loader refuses a truncated, corrupt or foreign file with a clear message.
 * This header is the only part of the compiler the runtime sees; the .c files
 * of plan/ implement it, and both the compiler and the runtime library hold them. */
#ifndef TCC_PLAN_H
#define TCC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define PLAN_FORMAT "tcc-plan"
#define PLAN_VERSION 6
#define PLAN_MAX_AXES 8
#define PLAN_MAX_RANK 8
#define PLAN_ALIGN 64 /* every tensor offset is a multiple of this */

/* Same order as the IR's DType. */
typedef enum { PD_F32, PD_F64, PD_BF16, PD_F16, PD_I32, PD_COUNT } PlanDType;

typedef enum {
    PT_PARAM, /* trained; initialised from init, kept across steps, checkpointed */
    PT_STATE, /* optimizer state; zeros at start, kept across steps, checkpointed */
    PT_INPUT, /* data, written by the runtime before each step */
    PT_STEP,  /* f32[]: the runtime writes the 1-based step number before each step */
    PT_HYPER, /* f32[] or f64[]: a hyperparameter (the peak learning rate "lr"), init_arg its default;
                 set at start, changeable by the runtime (--lr) */
    PT_TEMP,  /* computed during the step */
    PT_COORD, /* i32[]: the runtime writes this device's block index over the mesh axes
                 `coord` (major to minor) times init_arg (a vocabulary shard's first row) */
    PT_COUNT
} PlanRole;

typedef struct PlanTensor {
    char *name;                    /* parameter / input name; "" for temporaries */
    PlanDType dtype;
    int rank;
    int64_t shape[PLAN_MAX_RANK];
    uint64_t offset, bytes;        /* in the slab; bytes = numel * dtype size */
    PlanRole role;
    char *init;                    /* PT_PARAM: zeros|ones|normal|uniform|constant; "keys": an
                                      input i32[n] the runtime writes from the seed, not from
                                      data (dropout's row keys, plan_is_keys); else "" */
    double init_arg;               /* std, a or value */
    int layer;                     /* -1 outside any repeat */
    int64_t limit;                 /* PT_INPUT i32: ids must lie in [0, limit); else 0 */
    int value;                     /* the graph-IR Value.id it holds (for debugging: the
                                      printed %N renumbers values in definition order) */
    /* How the global tensor is split over the mesh: dim d over the axes
     * split[d][0..nsplit[d]) (major to minor); shape is this device's block. */
    uint8_t nsplit[PLAN_MAX_RANK];
    int8_t split[PLAN_MAX_RANK][PLAN_MAX_AXES];
    int ncoord;                    /* PT_COORD: the axes, else 0 */
    int8_t coord[PLAN_MAX_AXES];
    int stage;                     /* the pipeline stage whose devices hold its current value;
                                      -1: every stage (one-stage plans) */
    int frame;                     /* loop plans: 1 + the frame of a value each microbatch
                                      holds from one of its pieces to a later one (offset is
                                      from the frame's base, one base per microbatch); 0 none.
                                      -1 (expanded plans): one microbatch's rows of an input, a
                                      copy's source only, at any offset */
} PlanTensor;

typedef enum {
    PI_KERNEL, /* call kernels[kernel] with the tensors args[0..nargs) */
    PI_GEMM,   /* C = alpha op(A) op(B) + beta C, row-major, batch times with strides */
    PI_COPY,   /* bytes of tensor args[1] into tensor args[0] (same size) */
    PI_COLL,   /* a collective (or a local shard slice) from args[0] into args[1]; send and
                  recv take one tensor, args[0] */
    PI_COUNT
} PlanInstrKind;

/* Collectives over the group of devices that differ only in the axes coll.axes
 * (its members ordered by their block index over those axes, major to minor).
 * Shapes are per device; dim is where blocks are laid out. Send and recv are
 * point to point between pipeline stages: coll.axes are the pipeline-role
 * axes, so member s of the group is the device of stage s. */
typedef enum {
    PC_ALL_REDUCE,     /* out = sum over the group of in (same shape) */
    PC_ALL_GATHER,     /* out[..., n * k, ...] = the members' in[..., k, ...] along dim */
    PC_REDUCE_SCATTER, /* out = this member's block along dim of the sum of in */
    PC_ALL_TO_ALL,     /* in split along dim2 into n blocks, block j to member j; out = the
                          blocks received, concatenated along dim */
    PC_SLICE,          /* out = this member's block of in along dim (no communication) */
    PC_ALL_REDUCE_MAX, /* out = elementwise maximum over the group of in */
    PC_SEND,           /* args[0] to member peer (buffered: returns without waiting) */
    PC_RECV,           /* args[0] = what member peer sent with the same tag (blocking) */
    PC_COUNT
} PlanCollKind;

typedef struct PlanColl {
    PlanCollKind op;
    int naxes;
    int8_t axes[PLAN_MAX_AXES]; /* indices into Plan.axes */
    int dim, dim2;               /* dim2: all_to_all only, else -1 */
    int64_t bytes;               /* what one device sends (ring algorithms): for logs */
    int peer, tag;               /* send/recv: the other stage (its block index over axes),
                                    and the tag in [0, 32767] that pairs a send with its recv */
} PlanColl;

enum { PE_NONE, PE_BIAS };

typedef struct PlanGemm {
    int a, b, c;                       /* tensor indices */
    int trans_a, trans_b;
    int64_t m, n, k;                   /* op(A) is m x k, op(B) k x n, C m x n */
    int64_t lda, ldb, ldc;             /* leading dimensions, in elements */
    int64_t batch;                     /* >= 1 */
    int64_t stride_a, stride_b, stride_c; /* elements between batch members (0: shared) */
    double alpha, beta;
    int epilogue;                      /* PE_NONE, or PE_BIAS: the tensor bias, n elements of
                                          C's dtype, is added to every row of C (beta 0) */
    int bias;
} PlanGemm;

/* The scalar work of one call of a kernel's C rendering (codegen's cg_c_work),
 * which the CPU cost model reads: operations, steps of running reductions,
 * float divisions and square roots, math-library calls, tanh calls; serial:
 * its loop runs on one thread. */
typedef struct PlanWork {
    double ops, chain, divs, calls, tanh;
    int serial;
    double vops; /* operations of a loop that runs as vectors (its divisions: 4 each) */
    double chain_len; /* the chains' length (steps), weighted by their steps; 0: one long chain */
} PlanWork;

/* When an instruction of a loop plan's piece runs (docs/plan.md). */
typedef enum {
    PW_EVERY, /* each time its piece runs, for that microbatch */
    PW_LAST,  /* once: when its piece runs for the last microbatch (a sum over microbatches is
                 complete), or the one run of the prologue or epilogue */
    PW_FIRST, /* once: when its piece runs for the first microbatch (a value every
                 microbatch reads, received from another stage) */
    PW_COUNT
} PlanWhen;

typedef struct PlanInstr {
    PlanInstrKind kind;
    int kernel;    /* PI_KERNEL */
    int nargs;
    int *args;     /* PI_KERNEL, PI_COPY: tensor indices */
    PlanGemm gemm; /* PI_GEMM */
    PlanColl coll; /* PI_COLL */
    int phase;     /* 0 fwd, 1 bwd, 2 recompute, 3 opt: for profiles and logs */
    int layer;
    int stage;     /* the pipeline stage whose devices run it (0 in one-stage plans) */
    /* loop plans (Plan.nsched > 0): the piece it belongs to (a tick of the schedule table;
     * one outside the table runs once, before or after the table's pieces), when it runs,
     * and acc: a microbatch_sum's add of args[1] into args[0], a copy for microbatch 0
     * (a gemm: its product added into C, beta 1; beta 0 for microbatch 0) */
    int piece;
    PlanWhen when;
    int acc;
    int group;     /* kernels, plans without a microbatch loop: > 1 on the first of that many
                      consecutive kernel instructions of one stage, independent of each other,
                      that the CPU runs in one parallel region (their kernels' NAME_ws forms,
                      with the source's tcc_run_group); 0 otherwise */
    int rows;      /* loop plans: a copy of the microbatch's rows of input args[1] (its block
                      mb of microbatches along the first dimension) into args[0] */
    /* compile time only (not in the plan file, 0 after loading): the microbatch of the
     * op it came from (-1: shared) and the op's order key on its stage (its schedule
     * piece, passes/pipeline.c), which the memory model reads; and the FLOPs it does
     * (GEMMs and attention kernels, else 0) and a kernel's work, which the cost model reads */
    int mb, tick;
    int grouped; /* compile time only: a member of a group after its first */
    double flops;
    PlanWork work;
    int op; /* compile time only: 1 + the index in the per-device graph's ops of the op it
               was lowered from (a send: the op that computed its tensor; a recv: its first
               reader); 0: none, and after loading. For messages */
} PlanInstr;

typedef struct PlanKernel {
    char *name;  /* the C symbol in kernel_source: void NAME(char *const *args) */
    int nargs;
    int pattern; /* 0 pointwise, 1 row, 2 attention, 3 attention backward: for profiles */
    int64_t grid; /* the GPU launch of its gpu_source rendering: grid blocks of block threads */
    int block;
} PlanKernel;

typedef struct PlanAxis {
    char *name;
    char *role;
    int size;
    int64_t stride; /* the placement: ranks between neighbours along the axis (the innermost
                       axis 1, the next its size, ...); 0 in every axis: row-major, the last
                       axis innermost (plan_axis_stride) */
} PlanAxis;

/* A loop plan's schedule table: on stage `stage`, piece `piece` runs for
 * microbatch mb. Each stage's entries are in the order it runs them. */
typedef struct PlanSched {
    int stage, piece, mb;
} PlanSched;

/* A frame: the memory of the values one microbatch holds between pieces of
 * stage `stage`, `bytes` long, at base[mb] in that stage's slab. */
typedef struct PlanFrame {
    int stage;
    uint64_t bytes;
    uint64_t *base; /* Plan.microbatches offsets */
} PlanFrame;

/* A parameter of the TDL model, after -D: what a checkpoint made elsewhere
 * (runtime/hf.c) is checked against. */
typedef struct PlanParam {
    char *name;
    int64_t value;
} PlanParam;

typedef struct Plan {
    int version;
    char *model;
    int nconfig;
    PlanParam *config;          /* the model's integer parameters (V, D, H, L, ...); nconfig 0
                                   in plans written before them */
    int naxes;
    PlanAxis *axes;
    uint64_t slab_bytes;        /* the largest slab of a device: max of stage_slab_bytes */
    uint64_t *stage_slab_bytes; /* by pipeline stage: its devices' slab (each stage has its own
                                   address space); NULL: every stage's is slab_bytes */
    char train_hash[17];        /* the training run whatever the mesh (16 hex digits, or ""
                                   when unknown): what a checkpoint must match to resume */
    int ntensors;
    PlanTensor *tensors;
    int ninstrs;
    PlanInstr *instrs;
    int nkernels;
    PlanKernel *kernels;
    char *kernel_source; /* C99 + OpenMP; includes what it needs */
    char *gpu_source;    /* the same kernels in CUDA C for NVRTC: extern "C" __global__ NAME(T *a0,
                            ...), one pointer per tensor argument; "" when not rendered */
    int loss, lr, grad_norm; /* tensor indices of the step's outputs (-1: none) */
    double flops;        /* model FLOPs of one step (for GFLOP/s) */
    int64_t steps, seed; /* the train block's steps and seed, the program's defaults (its
                            --steps and --seed override them); 0 and -1 when not set */
    /* The microbatch loop (docs/plan.md): the instructions are one microbatch's
     * step, cut into pieces; the schedule table runs each piece once per entry,
     * for its microbatch: an input is read at that microbatch's rows, a frame
     * tensor at that microbatch's frame, a message has tag + mb * ntags. nsched
     * 0: a plain program (one microbatch, or a plan already expanded). */
    int microbatches;    /* of the step (1: none) */
    int nsched;
    PlanSched *sched;
    int nframes;
    PlanFrame *frames;
    int ntags;           /* the tags of one microbatch's messages: [0, ntags) */
    char hash[17];       /* 16 hex digits over everything above */
} Plan;

/* The tensors instruction in touches: its args, then a GEMM's a, b, c (and
 * bias): plan_instr_ntensors of them, the j-th plan_instr_tensor. */
int plan_instr_ntensors(const PlanInstr *in);
int plan_instr_tensor(const PlanInstr *in, int j);

/* The error convention of the plan and runtime modules: the message into
 * err[n] (when err is not NULL), and -1 returned. */
int plan_errorf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

size_t plan_dtype_size(PlanDType t);
const char *plan_coll_name(PlanCollKind k); /* "all_reduce" */
/* Instruction i in a few words, the same in the runtime's messages and
 * profile and in the cost model's: "kernel NAME", "gemm MxNxK f32" (xB
 * batches), "copy", a collective's name. buf, or "" when n is 0. */
const char *plan_instr_label(const Plan *p, int i, char *buf, size_t n);
/* The devices of the mesh: the product of the axis sizes (1 without axes). */
int64_t plan_mesh_size(const Plan *p);
/* The placement of the mesh on the ranks: axis a's stride (PlanAxis.stride,
 * or row-major when the plan has none); the coordinates of rank r; the rank
 * of coordinates. */
int64_t plan_axis_stride(const Plan *p, int a);
/* The axes' indices into order[naxes], innermost first: by stride, an axis of
 * size 1 before the others of its stride, then by index. */
void plan_axes_by_stride(const Plan *p, int *order);
void plan_coords(const Plan *p, int64_t rank, int *coord);
int64_t plan_rank(const Plan *p, const int *coord);
/* The devices of a group over axes[0..naxes) (indices into p->axes): the
 * product of their sizes (1 for none). */
int64_t plan_axes_size(const Plan *p, const int8_t *axes, int naxes);
/* The pipeline stages: the product of the sizes of the axes whose role is
 * "pipeline" (1 without; INT_MAX when larger). A device's stage is its block
 * index over those axes, major to minor. */
int plan_stages(const Plan *p);
const char *plan_dtype_name(PlanDType t);
const char *plan_role_name(PlanRole r);
/* Whether t is dropout's row keys: an input the runtime writes from the seed. */
int plan_is_keys(const PlanTensor *t);
/* The slab of the devices of pipeline stage `stage`; for -1 the smallest of
 * all stages' (where the tensors held by every stage lie). */
uint64_t plan_stage_slab(const Plan *p, int stage);
/* Whether the devices of stage `stage` hold tensor t in their slab: t's stage
 * is -1 or `stage`, or t is an output (loss, lr, grad_norm: broadcast to every
 * stage after a step). */
int plan_stage_holds(const Plan *p, int stage, int t);

/* Bytes of staging a device needs beside the slab for p's copies and
 * collectives: the largest plan_instr_scratch. The runtime allocates this;
 * the compiler's memory model counts it. */
uint64_t plan_scratch_bytes(const Plan *p, int cuda);

/* The staging instruction in stages there. CPU (cuda 0): a bucket's inputs,
 * twice an all_to_all's input. CUDA (cuda 1, runtime/gpu): a copy between
 * tensors that may share bytes, its destination; an all_gather whose
 * dimension is not the outermost, its output (NCCL gathers whole chunks);
 * a reduce_scatter of such a dimension, its input; an all_to_all, its input
 * twice (the blocks sent and received); nothing else. */
uint64_t plan_instr_scratch(const Plan *p, const PlanInstr *in, int cuda);

/* The content hash of p (FNV-1a 64 over a canonical serialisation), as 16 hex
 * digits in out[17]. */
void plan_hash(const Plan *p, char out[17]);

/* Check the meaning of a plan in memory: every rule plan_load applies once the
 * JSON is read (ranges, sizes, offsets in the slab, instruction operands, and
 * last plan_check_comm), but not the hash. 0, or -1 with a message in err that
 * names the field. */
int plan_check(const Plan *p, char *err, size_t errlen);
/* plan_check without plan_check_comm. */
int plan_check_struct(const Plan *p, char *err, size_t errlen);

/* Whether the stages' programs communicate as one (plan/comm_match.c): on each
 * channel (an ordered pair of stages) the k-th send and the k-th recv agree in
 * tag, bytes and dtype; the member stages of a group that spans stages issue
 * the same collectives in the same order (kind, dims, sizes, dtype); and no
 * device can wait forever (sends buffered, recvs and collectives blocking),
 * in the step and in the forward-only run. Each stage's program is walked
 * once, whatever the number of devices. 0, or -1 with a one-line message that
 * names the instruction, its stage and ranks, and the difference or the cycle
 * of waits; *at (when at is not NULL) the instruction named first, else -1.
 * p must pass plan_check's other rules. */
int plan_check_comm(const Plan *p, int *at, char *err, size_t errlen);

/* A loop plan (nsched > 0) made into the program the runtime runs, in
 * place: each stage's pieces, once per entry of its schedule table, with
 * each microbatch's own input rows, frames and tags, and the receives of
 * each channel in the order of its sends; then plan_check's rules and
 * plan_check_comm. A plain plan is left as it is. 0, or -1 with a message
 * in err. An instruction of the program keeps the compile-time `op` of the
 * one it came from. */
int plan_expand(Plan *p, int owned, int *at, char *err, size_t errlen);
/* owned: p's arrays are the heap's (plan_load), freed as they are replaced;
 * else they are left alone (the compiler's arena). at (when not NULL): the
 * instruction plan_check_comm names in the program, or -1. */

/* One instruction of a loop plan's expanded program: instrs[src] for
 * microbatch mb (-1: an instruction that runs once, as compiled), in the run
 * of its stage's entry `entry` (0 the prologue, 1.. the table's entries of
 * that stage in order, then the epilogue). */
typedef struct PlanItem {
    int src, mb, entry;
} PlanItem;

/* The expanded program of loop plan p, as items (malloc'ed), every stage's
 * in stage order; 0, or -1 with a message. */
int plan_expand_order(const Plan *p, PlanItem **items, int *nitems, char *err, size_t errlen);
/* The tag of a send or recv item in the expanded program. */
int plan_item_tag(const Plan *p, const PlanItem *it);

/* Write p as JSON to path (atomically: a temporary file renamed into place),
 * with p's hash recomputed. 0, or -1 with a message in err. */
int plan_write(const char *path, Plan *p, char *err, size_t errlen);

/* Read and validate a plan: format name, version, every field's type and
 * range, tensor offsets aligned and inside the slab (tensors may alias: a
 * reshape shares its operand's memory), instruction operands in range and of
 * fitting sizes, the hash. NULL with a message in err that names the file and
 * what is wrong. */
Plan *plan_load(const char *path, char *err, size_t errlen);
void plan_free(Plan *p);
/* plan_load of a plan already in memory; name is used in messages. */
Plan *plan_parse(const char *name, const char *text, size_t len, char *err, size_t errlen);
/* The JSON that plan_write writes (hash recomputed), malloc'ed; NULL and err. */
char *plan_to_json(Plan *p, char *err, size_t errlen);

#endif
