/* ir.h: the graph IR. A Graph is one SSA program over tensors (Values) on a
 * device Mesh; every Value carries its global shape and a Sharding that says how
 * it is split over the mesh and why. Ops are listed in definition order (a
 * topological order). Nothing here knows a syntax, a pass or a target. */
#ifndef TCC_IR_H
#define TCC_IR_H

#include "../common/base.h"

#define IR_MAX_RANK 8
#define IR_MAX_AXES 8
#define IR_FORMAT_VERSION 1

typedef enum { DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_COUNT } DType;

/* What a mesh axis is for; it decides the default shardings. */
typedef enum {
    ROLE_DATA,     /* splits the batch dimension of inputs */
    ROLE_FSDP,     /* splits parameters (and their optimizer state) */
    ROLE_TENSOR,   /* Megatron column/row parallelism, heads, vocabulary */
    ROLE_SEQUENCE, /* sequence / context parallelism */
    ROLE_PIPELINE, /* pipeline stages */
    ROLE_COUNT
} AxisRole;

typedef struct MeshAxis {
    const char *name; /* interned */
    int size;         /* >= 1 */
    AxisRole role;
    Loc loc;          /* where the axis was declared */
} MeshAxis;

typedef struct Mesh {
    int naxes;
    MeshAxis axes[IR_MAX_AXES];
    int nplace;                 /* --place: 0, or naxes with place[0] the innermost axis */
    int8_t place[IR_MAX_AXES];
} Mesh;

/* Why a sharding was chosen. Printed next to every non-trivial sharding. */
typedef enum {
    WHY_NONE,       /* never decided: replicated by default */
    WHY_ANNOTATION, /* a TDL annotation at loc */
    WHY_ROLE,       /* a mesh-axis role default; detail names the axis */
    WHY_RULE,       /* propagated through an op; detail names the rule */
    WHY_COST,       /* chosen by the cost model; detail says what it compared */
    WHY_USER,       /* edited by hand in an IR file */
    WHY_COUNT
} WhyKind;

typedef struct Why {
    WhyKind kind;
    Loc loc;            /* WHY_ANNOTATION: the annotation; else LOC_NONE */
    const char *detail; /* interned or arena string; NULL when none */
} Why;

/* For each dimension, the ordered list (major to minor) of mesh axes it is split
 * over; plus the axes over which the value holds partial sums not yet reduced.
 * All zero is replicated. */
typedef struct Sharding {
    uint8_t naxes[IR_MAX_RANK];
    int8_t axes[IR_MAX_RANK][IR_MAX_AXES]; /* indices into Mesh.axes */
    uint32_t partial;                      /* bit i: partial sum over mesh axis i */
    Why why;
} Sharding;

typedef struct Op Op;

typedef struct Value {
    int id;            /* index in Graph.values; printed %id */
    const char *name;  /* source name (params: full dotted name), NULL if none */
    DType dtype;
    int rank;
    int64_t shape[IR_MAX_RANK]; /* global (logical) shape */
    Sharding shard;
    Op *def;           /* defining op */
    Loc loc;
} Value;

/* Attribute values: a small tree, so an optimizer spec like
 * adamw(lr = 6e-4, betas = [0.9, 0.95]) is one Attr. */
typedef enum { ATTR_INT, ATTR_FLOAT, ATTR_BOOL, ATTR_STR, ATTR_LIST, ATTR_CALL } AttrKind;

typedef struct Attr {
    const char *key;   /* NULL for positional items */
    AttrKind kind;
    int64_t i;         /* INT, BOOL */
    double f;          /* FLOAT */
    const char *s;     /* STR: the text; CALL: the callee name */
    struct Attr **items; /* LIST, CALL */
    int nitems;
} Attr;

typedef enum {
#define OP(id, name, nargs, nres, doc) OP_##id,
#include "ops.def"
#undef OP
    OP_COUNT
} OpKind;

typedef struct OpInfo {
    const char *name;
    int nargs; /* -1: one or more */
    int nres;
    const char *doc;
} OpInfo;
extern const OpInfo ir_ops[OP_COUNT];
/* Whether op has its kind's operand count (ir_ops[].nargs), or up to three
 * more where they are optional: attention's and attention_grad's mask, score
 * bias and ALiBi's head offset (after q, k, v and dout, in any order). */
int ir_op_arity_ok(const Op *op);
/* Whether op has its kind's result count: attention_grad has a fourth, the
 * bias's gradient, where its bias takes one. */
int ir_op_nres_ok(const Op *op);
/* attention's (attention_grad's) optional operand of that rank: 2 the mask
 * [B,Sk], 3 the score bias [1 or H, S, Sk], 0 ALiBi's head offset; -1 when
 * it has none (or op is another kind). */
int ir_attention_arg(const Op *op, int rank);

typedef enum { PH_FWD, PH_BWD, PH_RECOMPUTE, PH_OPT, PH_COUNT } Phase;

struct Op {
    int id;           /* index in Graph.ops */
    OpKind kind;
    Value **args;
    int nargs;
    Value **res;
    int nres;
    Attr **attrs;     /* sorted by nothing: kept in insertion order */
    int nattrs;
    Loc loc;
    int layer;        /* repeat index, -1 outside any repeat */
    Phase phase;
    int stage;        /* pipeline stage, 0 until the pipeline pass */
    int mb;           /* the microbatch it computes, -1 when shared by all (passes/microbatch) */
    int tick;         /* order key on its stage: the schedule's piece, 0 before the first
                         (passes/pipeline); a stage runs its ops by (tick, position) */
};

/* One piece of a pipeline schedule on a stage: the piece whose ops carry
 * tick (its instance for microbatch 0) run for microbatch mb. */
typedef struct SchedStep {
    int stage, tick, mb;
} SchedStep;

typedef struct Graph {
    Arena *arena;
    Interner *strings;
    const char *name;  /* the model name */
    Mesh mesh;
    VEC(Attr *) config; /* model parameters after -D: INT attrs keyed by name */
    VEC(Attr *) train;  /* the train block, keyed, not interpreted here */
    VEC(Op *) ops;
    VEC(Value *) values;
    VEC(Value *) outputs; /* what the step returns (the loss first) */
    VEC(SchedStep) sched; /* every stage's pieces in the schedule's order (passes/pipeline):
                             a graph of one microbatch runs its pieces once per entry */
} Graph;

/* ---- names and tables ---- */
const char *ir_dtype_name(DType t);      /* "f32" */
int ir_dtype_lookup(const char *name);   /* DType, or -1 */
int ir_dtype_is_float(DType t);
size_t ir_dtype_size(DType t);
const char *ir_role_name(AxisRole r);    /* "data" */
int ir_role_lookup(const char *name);    /* AxisRole, or -1 */
const char *ir_why_name(WhyKind k);      /* "annotation" */
int ir_why_lookup(const char *name);
const char *ir_phase_name(Phase p);      /* "fwd" */
int ir_phase_lookup(const char *name);
int ir_op_lookup(const char *name);      /* OpKind, or -1 */

/* The pipeline stages of a mesh: the product of its pipeline-role axes' sizes. */
int ir_pipeline_stages(const Mesh *m);

/* The elements of v's global shape. */
double ir_numel(const Value *v);
/* The nominal FLOPs of op on global shapes: 2 M N K per matmul, 4 B S^2 (H Dh)
 * per attention, 4 per logit (cross_entropy) or gathered element (embed), one
 * per result element for the rest; 0 for an op without results. The pipeline
 * pass balances stages by it, and recompute reports what it adds. */
double ir_op_flops(const Op *op);

/* Same kind, key and value (items compared in order). */
int ir_attr_equal(const Attr *a, const Attr *b);
/* By value id, in a: for each result of a recompute op, the forward value it
 * recomputes (the result of a forward op of the same kind, attributes,
 * location, layer and microbatch whose operands are the same values or the
 * ones they recompute); NULL for every other value. */
const Value **ir_recompute_twins(const Graph *g, Arena *a);

/* ---- building ---- */
Graph *ir_graph_new(Arena *a, Interner *strings, const char *name);
/* A new Value owned by g (not yet defined by an op). */
Value *ir_value_new(Graph *g, DType t, int rank, const int64_t *shape);
/* Append an op of kind with the given operands; results are added with
 * ir_op_result. Layer -1, phase fwd, stage 0, mb -1, tick 0. */
Op *ir_op_new(Graph *g, OpKind kind, Value **args, int nargs, Loc loc);
/* dst, made by a pass after the pipeline pass (dst's args set), takes site's
 * layer, phase and stage, is shared by the microbatches (mb -1) and follows its
 * operands: its tick is the largest of theirs. */
void ir_op_place_like(Op *dst, const Op *site);
Value *ir_op_result(Graph *g, Op *op, DType t, int rank, const int64_t *shape);
void ir_op_set_attr(Graph *g, Op *op, Attr *a);          /* replaces same key */
/* Give op its attrs and the results its shape rule gives (ir_infer_result).
 * For passes that build ops known to be valid: a rule refusing is a bug of
 * the pass, reported as an internal error naming `who`. */
void ir_op_finish(Graph *g, Op *op, Attr **attrs, int nattrs, const char *who);
const Attr *ir_op_attr(const Op *op, const char *key);   /* NULL when absent */
int64_t ir_op_attr_int(const Op *op, const char *key, int64_t dflt);
double ir_op_attr_float(const Op *op, const char *key, double dflt); /* INT or FLOAT */
/* Whether v is a scalar that the compile knows (a constant, or the add, sub,
 * mul, div or neg of such; f32 or f64), each step rounded to its dtype as
 * its kernel would: its value in *out. */
int ir_scalar_value(const Value *v, double *out);
/* The permutation of a transpose: result dim d is operand dim perm[d]. Its
 * attr perm, or without one the last two dims swapped. The one reading of
 * a transpose every room shares (shape, sharding, autodiff, kernels). */
void ir_transpose_perm(const Op *op, int64_t perm[IR_MAX_RANK]);

Attr *ir_attr_int(Arena *a, const char *key, int64_t v);
Attr *ir_attr_float(Arena *a, const char *key, double v);
Attr *ir_attr_bool(Arena *a, const char *key, int v);
Attr *ir_attr_str(Arena *a, const char *key, const char *s);
Attr *ir_attr_list(Arena *a, const char *key, Attr **items, int n);   /* items copied */
Attr *ir_attr_call(Arena *a, const char *key, const char *fn, Attr **items, int n);
Attr *ir_attr_ints(Arena *a, const char *key, const int64_t *v, int n); /* LIST of INT */

/* ---- mesh and sharding ---- */
int ir_mesh_axis(const Mesh *m, const char *name);        /* index, or -1 */
int64_t ir_mesh_size(const Mesh *m);                      /* product of axis sizes */
/* The devices of a group over axes[0..n) of m: the product of their sizes. */
int64_t ir_axes_size(const Mesh *m, const int8_t *axes, int n);
/* How many pieces dimension dim is split into (product of its axes' sizes). */
int64_t ir_shard_factor(const Mesh *m, const Sharding *s, int dim);
int ir_shard_is_replicated(const Sharding *s, int rank);
/* Append axis to dimension dim's list (no checks). */
void ir_shard_add(Sharding *s, int dim, int axis);

/* ---- shape rules (ir/shape.c) ----
 * Compute the result dtype and shape of op from its operands and attrs.
 * Returns 0, or -1 with a lowercase message in err (no location, no period),
 * e.g. "shapes f32[4,8] and f32[5,8] do not broadcast". Unknown attrs are
 * ignored; missing attrs take their documented defaults. */
int ir_infer(const Op *op, DType *dt, int *rank, int64_t *shape, char *err, size_t errlen);
/* The type of result i of op (ir_infer for i == 0; later results of the
 * multi-result backward ops mirror an operand). Same return and err as ir_infer. */
int ir_infer_result(const Op *op, int i, DType *dt, int *rank, int64_t *shape, char *err,
                    size_t errlen);
/* "f32[8,1024,768]" into buf (no sharding). */
const char *ir_type_str(char *buf, size_t n, DType t, int rank, const int64_t *shape);

/* ---- the train block's meaning (ir/train_block.c) ---- */
typedef enum { OPT_SGD, OPT_ADAMW } OptimizerKind;
typedef enum { SCHED_CONSTANT, SCHED_COSINE, SCHED_LINEAR } ScheduleKind;

typedef struct TrainConfig {
    OptimizerKind optimizer;
    double lr, momentum, beta1, beta2, eps, weight_decay;
    double lr_override, wd_override; /* top-level lr / weight_decay; -1 when absent */
    ScheduleKind schedule;
    int64_t warmup, total_steps;
    double min_lr;
    double grad_clip; /* 0: no clipping */
    int64_t microbatches, virtual_stages, zero, steps, seed;
    int64_t sequence_parallel; /* 1: norms and elementwise ops split the sequence over the tensor axis */
    int64_t grad_accumulation_fusion; /* 1 (default): a weight gradient's GEMM adds into its f32 sum */
    const char *recompute, *precision, *pipeline;
    const Attr *stage_starts; /* the list of stage_starts (the pipeline pass checks it); NULL: none */
} TrainConfig;

void ir_train_defaults(TrainConfig *tc);
/* Whether g's parameters are gathered again for the backward (zero = 3, or
 * an fsdp axis of more than one device): each phase makes its own copies. */
int ir_regathers(const Graph *g, const TrainConfig *tc);
/* Apply one keyed setting of a train block; -1 with a message in err when the
 * key is unknown or the value has the wrong form. */
int ir_train_set(TrainConfig *tc, const Attr *a, char *err, size_t n);
/* Every setting of g->train over the defaults, then the cross-checks
 * (a cosine schedule needs a step count, ...). */
int ir_train_config(const Graph *g, TrainConfig *tc, char *err, size_t n);
/* The settings applied so far (ir_train_set) made whole: the top-level lr and
 * weight_decay over the optimizer's, the schedule's steps, the cross-checks. */
int ir_train_finish(TrainConfig *tc, char *err, size_t n);

/* ---- text form (ir/print.c, ir/parse.c; docs/ir.md) ---- */
void ir_print(FILE *out, const Graph *g);
char *ir_print_string(Arena *a, const Graph *g); /* the same text in the arena */
void ir_print_value_type(FILE *out, const Graph *g, const Value *v); /* f32[8@dp,16] partial(tp) */
/* One op's line as ir_print writes it (the same %N numbering). */
void ir_print_op(FILE *out, const Graph *g, const Op *op);
/* Parse the printed form; errors go to c->diag with locations in `name`.
 * NULL after errors. The result's strings are interned in c->strings. */
Graph *ir_parse(Ctx *c, const char *name, const char *text, size_t len);

/* ---- verifier (ir/verifier.c) ----
 * Checks every structural invariant (SSA, defs before uses, arity, shapes and
 * dtypes by ir_infer, sharding axes in range and used once, divisibility,
 * partial bits in range, outputs defined). Reports each violation to c->diag
 * at the op's location, prefixed "invalid IR: ". Returns 0 or -1. */
int ir_verify(Ctx *c, const Graph *g);

#endif
