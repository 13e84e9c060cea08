/* codegen.h: Kernel IR and the plan builder.
 * A Kernel is one parallel loop over `extent` work items whose body is a flat
 * list of statements over a scalar expression DAG: loads at computed indices,
 * arithmetic, inner loops that reduce (sum, max, min) or store. The two
 * iteration patterns of the architecture fall out of it: pointwise (no inner
 * loop) and row (inner loops over a row's columns). Attention forward and
 * backward are kernels of their own pattern with fixed parameters. Nothing in
 * a Kernel is specific to C: the C emitter maps the parallel loop to OpenMP,
 * a GPU emitter maps it to blocks (row) or threads (pointwise). */
#ifndef TCC_CODEGEN_H
#define TCC_CODEGEN_H

#include "../ir/ir.h"
#include "../plan/plan.h"

typedef enum { KT_FLOAT, KT_INT } KType; /* the kernel's float type, or int64 */

typedef enum {
    KN_CONST,   /* imm */
    KN_ICONST,  /* iimm */
    KN_IDX,     /* index of loop level a: 0 the parallel item, 1.. inner loops */
    KN_LOAD,    /* args[a] at int node b (int when the arg is i32, else float) */
    KN_ACC,     /* the reduced value of the loop opened by statement a, after it */
    KN_ADD, KN_SUB, KN_MUL, KN_DIV, KN_MAX, KN_MIN, KN_POW, /* float or int by type */
    KN_NEG, KN_EXP, KN_LOG, KN_SQRT, KN_RSQRT, KN_TANH, KN_COS, KN_SIN, KN_ABS, KN_ERF,
    KN_FLOOR,
    KN_LT,      /* a < b as 0 or 1, float or int operands; result type int */
    KN_EQ,      /* a == b likewise */
    KN_LE,      /* a <= b likewise */
    KN_NE,      /* a != b likewise (1 when either is NaN) */
    KN_SELECT,  /* int a ? b : c (b, c already computed: both sides must be safe) */
    KN_IDIV, KN_IMOD, /* int */
    KN_TOFLOAT, KN_TOINT,
    KN_HASH,    /* int a, b -> int in [0, 2^63): splitmix64's finalizer of a * golden ^ b (dropout) */
    KN_BF16,    /* float a rounded to bf16 and widened again: a fused cast's rounding */
    KN_COUNT
} KNodeKind;

typedef struct KNode {
    KNodeKind kind;
    KType type;
    int a, b, c;
    double imm;
    int64_t iimm;
} KNode;

typedef enum {
    KS_NODE,      /* evaluate node a */
    KS_LOOP,      /* open an inner loop over [0, extent); its index node is KN_IDX level 1 */
    KS_REDUCE,    /* inside the loop opened by statement a: fold node b into its
                     accumulator with op c (a KReduce) */
    KS_END,       /* close the innermost loop */
    KS_STORE,     /* args[a][node b] = node c */
    KS_STORE_ADD, /* args[a][node b] += node c */
} KStmtKind;

typedef enum { KR_SUM, KR_MAX, KR_MIN } KReduce;

typedef struct KStmt {
    KStmtKind kind;
    int a, b, c;
    int64_t extent; /* KS_LOOP */
} KStmt;

typedef enum { KP_POINTWISE, KP_ROW, KP_ATTENTION, KP_ATTENTION_BWD } KPattern;

typedef struct KAttention {
    int64_t batch, seq, heads, kv_heads, head_dim;
    int causal;
    double scale;
    int64_t window; /* a query sees the keys less than window positions away; 0: all */
    int mask;       /* the argument of the mask [B][seq_k] (key j of row b seen where nonzero), the
                       kernel's last; -1: none */
    int alibi;      /* ALiBi: each score gets -slope(head) |i - j| (tcc_alibi_slope) */
    int64_t heads_whole; /* ALiBi: the global head count the slopes are of */
    int hoff;       /* ALiBi: the argument holding the first column of this device's heads in
                       the whole q (heads split over devices); -1: 0 */
    double softcap; /* the scaled scores s become softcap tanh(s / softcap) (Gemma 2); 0: none */
    int64_t seq_k;  /* the keys' and values' length (and the mask's): seq but in cross-attention */
    int64_t head_dim_v; /* the values' (and the output's) head size: head_dim but in
                           DeepSeek-V2's latent attention */
    int bias;       /* the argument of the score bias [bias_heads][seq][seq_k], added to each score
                       after the cap and ALiBi (T5); -1 (0 in other kernels): none */
    int64_t bias_heads; /* the bias's heads: heads, or 1 (one bias for all heads) */
    int dbias;      /* the backward's argument of the bias's gradient (the kernel's last, zeroed
                       before: the bias's shape, summed over the batch); -1 (0): none */
    int64_t in_pitch[3], in_head[3], in_off[3]; /* q, k, v read in place from a fused q/k/v tensor
                       (codegen/fusion.c, views): element d of head h of row r (b S + i) at
                       r in_pitch + h in_head + in_off + d; in_pitch 0: a tensor of its own, row r at
                       r heads head_dim (as the outputs always are) */
} KAttention;

typedef struct Kernel {
    Arena *arena;     /* where its nodes and statements grow */
    const char *name;
    KPattern pattern;
    int64_t extent;   /* work items of the parallel loop */
    DType ftype;      /* the float type of the arithmetic: f32 or f64 */
    int nargs;
    int args[64];     /* plan tensor indices */
    DType arg_dtype[64];
    VEC(KNode) nodes;
    VEC(KStmt) body;
    int levels;       /* 1 when the kernel has inner loops (row pattern), else 0 */
    int npre;         /* body[0, npre): nodes the same for every item and loop iteration
                         (cg_simplify): a rendering may run them once, before the loops */
    KAttention attn;  /* KP_ATTENTION*: args q, k, v, o | q, k, v, dout, dq, dk, dv */
} Kernel;

enum {
    CG_KEEP_VALUES = 1, /* give every value its own memory, so all can be read after a step */
};

/* What the training state takes on one device of the mesh, in bytes:
 * parameters (as stored, and in bf16 the copies the step computes with when
 * it holds them from the forward to the backward: not under ZeRO-3 or fsdp,
 * which gather them again), gradients (as summed over the microbatches:
 * whole, or with zero >= 2 the shard of the optimizer state) and optimizer
 * state. */
typedef struct CgMemory {
    double params, grads, state;
    int nparams;
} CgMemory;
void cg_memory(const Graph *g, const TrainConfig *tc, CgMemory *m);

/* Build the plan of one training step from a verified graph (after autodiff
 * and the optimizer, or a forward-only graph) and its train settings (tc, as
 * the driver parsed them): tensors at slab offsets, kernels
 * with their C source, the instruction list. Temporaries whose lifetimes do
 * not overlap share memory unless flags has CG_KEEP_VALUES. Returns 0, or -1
 * after reporting (an op no kernel exists for). Strings and arrays of the plan
 * live in the arena; plan_free must not be called on it. */
int cg_build_plan(Ctx *c, const Graph *g, const TrainConfig *tc, int flags, Plan *out);

/* An executable at path out that trains with plan p: its kernels, the plan and
 * the runtime's training loop, built by the system compiler (the command is
 * printed to stderr when print_commands) with the kernels' flags of
 * runtime/cpu.c: for the building host's CPU (-march=native) unless portable.
 * 0, or -1 after reporting. */
int cg_write_program(Ctx *c, Plan *p, const char *out, int print_commands, int portable);

/* Whether the stages' programs of p, built from the per-device graph local,
 * communicate as one (plan_check_comm: sends and recvs paired, collectives
 * over stages matched, no deadlock). cg_build_plan runs it on every plan.
 * 0, or -1 after reporting at the location of the op the first instruction
 * named was lowered from. */
int cg_check_comm(Ctx *c, const Graph *local, const Plan *p);
/* Every kernel launches on a GPU (a grid under 2^31 blocks), or an error at
 * its op: a step that large is no step for one device. */
int cg_check_launches(Ctx *c, const Graph *local, const Plan *p);

/* cg_build_plan, and the plan's kernels in the Kernel IR, in the order of
 * out->kernels (*kernels: an arena array of out->nkernels). */
int cg_build_plan_ir(Ctx *c, const Graph *g, const TrainConfig *tc, int flags, Plan *out,
                     Kernel ***kernels);

/* cg_build_plan_ir, and the per-device graph the plan was built from: its
 * tensors' `value` fields index local->values. */
int cg_build_plan_local(Ctx *c, const Graph *global, const TrainConfig *tc, int flags, Plan *out,
                        Kernel ***kernels, const Graph **local);

/* Simplify a built kernel in place (simplify.c): constant folding, common
 * subexpressions, and the loop-invariant nodes hoisted into body[0, npre).
 * No result changes by a bit. */
void cg_simplify(Kernel *k);

/* C source of one kernel: void NAME(char *const *args). Every source needs
 * cg_c_prelude() once before its kernels (includes, the bf16 conversions). */
char *cg_emit_c(Arena *a, const Kernel *k);
const char *cg_c_prelude(void);
/* Whether cg_emit_c also writes NAME_ws (every kernel but attention's): the
 * loop shared out among the threads of the region it is called in, without
 * a barrier at its end; and the measure of its work that decides whether
 * NAME opens a region (more than 4096). */
int cg_c_workshared(const Kernel *k);
/* The same by a plan kernel's pattern (PlanKernel.pattern is the KPattern). */
int cg_pattern_workshared(int pattern);
int64_t cg_c_items(const Kernel *k);
/* The scalar work of one call of cg_emit_c's rendering of k, for the CPU cost
 * model: operations (loads, stores, arithmetic), steps of running reductions
 * (each waits for the one before), float divisions and square roots, calls
 * of the math library (exp, log, pow, sin, cos, fmax, fmin), tanh apart
 * (several times dearer), and whether its loop runs on one thread (its if
 * clause). */
PlanWork cg_c_work(const Kernel *k);
/* The reduction (a KReduce) of the loop that statement s opens, or -1. */
int cg_loop_reduce(const Kernel *k, int s);

/* ---- GPU renderings (emit_gpu.c) ----
 * One mapping of the Kernel IR onto a grid of blocks, spelled in CUDA C (for
 * NVRTC) or OpenCL C (run under PoCL by the tests). A kernel takes one
 * pointer per argument slot: CUDA `extern "C" __global__ void NAME(float
 * *__restrict__ a0, ...)`, OpenCL `__kernel void NAME(__global float *a0,
 * ...)`, storage types float, double, int (i32) and unsigned short (bf16
 * bits). It is launched as cg_gpu_launch says, with no dynamic shared memory;
 * every source needs cg_gpu_prelude(lang) once before it. */
typedef enum { CG_CUDA, CG_OPENCL } CgLang;
typedef struct CgLaunch {
    int64_t grid; /* blocks (work-groups) */
    int block;    /* threads (work-items) per block */
} CgLaunch;
CgLaunch cg_gpu_launch(const Kernel *k);
/* Whether an attention kernel's GPU rendering takes the tensor cores (bf16
 * q, k, v, a head size that is a multiple of 16 up to 128): its products
 * round p and ds to bf16 (codegen/emit_attention.c). */
int cg_attention_tensor_cores(const Kernel *k);
const char *cg_gpu_prelude(CgLang lang);
/* The kernel's source, or NULL after reporting when it cannot be rendered. */
char *cg_emit_gpu(Arena *a, const Kernel *k, CgLang lang);

#endif
