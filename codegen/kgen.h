/* kgen.h: private to codegen: the plan under construction and the Kernel
 * builder that kernels.c uses to write one kernel per op (or a few). */
#ifndef TCC_KGEN_H
#define TCC_KGEN_H

#include "codegen.h"

typedef struct KernelSeen {
    const Kernel *ir; /* a copy, as built */
    uint64_t hash;
    int index, next; /* gen->kernels; the next in its hash bucket, -1 at the end */
} KernelSeen;

typedef struct Gen {
    Ctx *c;
    const Graph *g;
    TrainConfig tc;               /* the train settings, parsed by the driver */
    Arena *a;
    VEC(PlanTensor) tensors;
    VEC(PlanInstr) instrs;
    VEC(Kernel *) kernels;        /* each distinct kernel once */
    VEC(uint64_t) kernel_hash;    /* by kernel: hash of its code under a neutral name */
    VEC(const char *) kernel_text;
    /* every distinct Kernel IR built so far, as built (before cg_simplify), with
     * the kernel it became; chained by hash (seen_head: seen_cap buckets) */
    VEC(struct KernelSeen) seen;
    int *seen_head, seen_cap;
    int *tensor_of; /* by Value.id: plan tensor, -1 when none */
    char *fused;    /* by Value.id: computed inside its only user's kernel, no memory */
    int *kept;      /* by Value.id: 1 + the index of the op whose kernel computes it and
                       stores it (its first reader: cg_find_fusions), or 0 */
    char *dead;     /* by op index: no result is read, nothing to run */
    char *view;     /* by Value.id: a slice of a fused q/k/v tensor that attention reads in
                       place (fusion.c, kernels.c), no memory, no kernel; NULL: none */
    char *bias_add; /* by op index: an add of a bias that its matmul's GEMM does (epilogue) */
    char *tgemm;    /* by op index: a transpose of a product that its matmul's GEMM writes */
    int *acc_gemm;  /* by op index: a sum of weight gradients whose GEMM adds its product
                       into it (beta 1): 1 + that matmul's index, else 0 (fusion.c) */
    int *ce_pair;   /* by op index: a cross_entropy whose row kernel also writes its gradient:
                       1 + the cross_entropy_grad's index; that gradient: -(1 + the
                       cross_entropy's), no kernel of its own; 0 otherwise (fusion.c) */
    uint64_t slab;
    uint64_t *stage_slab; /* by pipeline stage: its slab (cg_plan_memory) */
    const Op *op;   /* the op being lowered: phase, layer, name */
    VEC(int) owner; /* by instruction: the index of the op it was lowered from */
    double flops;
    /* the microbatch loop (codegen/microbatch_loop.c): the graph holds one microbatch of k */
    int loop, k;
    char *per_mb;   /* by Value.id: a microbatch's own value (not yet summed over them) */
    int ntags;      /* the tags of one microbatch's messages */
    VEC(PlanSched) sched;
    VEC(PlanFrame) frames;
} Gen;

/* ---- the plan's steps, in the order build_plan.c runs them ---- */

/* fusion.c: which values are computed inside another op's kernel or GEMM
 * (gen->fused, kept, dead, bias_add, tgemm); none with CG_KEEP_VALUES. */
void cg_find_fusions(Gen *gen, int flags);
/* What GEMM operand v reads through the transposes of its last two dims;
 * *flips counts them (odd: read with the transpose flag). */
const Value *cg_gemm_source(const Value *v, int *flips);
/* Which operands of matmul op a GEMM reads through transposes: bit 0 a, bit 1 b. */
int cg_gemm_folds(const Op *op);
/* The matmul result of add whose GEMM can add the bias (*bias) as its
 * epilogue, or NULL; uses (by value id, NULL: unchecked) must be 1 for it. */
const Value *cg_bias_matmul(const Op *add, const int *uses, const Value **bias);

/* tensors.c: a tensor for every value that needs memory (gen->tensor_of),
 * persistent ones first; the limits of index inputs. After cg_find_fusions. */
void cg_place_values(Gen *gen);
/* The plan role of the tensor of op's results (PT_TEMP for computed ones). */
PlanRole cg_role_of(const Op *op);
/* The mesh axis indices of op's attr `axes` into out; their number. */
int cg_attr_axes(const Gen *gen, const Op *op, int8_t *out);

/* instrs.c: appends op's instructions to gen->instrs; 0, or -1 after
 * reporting an op without a CPU kernel. */
int cg_lower_op(Gen *gen, const Op *op);

/* stages.c: each stage's program, its sends and receives, then the buckets
 * and the loop's pieces (cg_loop_pieces); 0, or -1 after reporting. */
int cg_stage_programs(Gen *gen);
/* buckets.c: the gradient all-reduces of each stage's program merged into buckets. */
void cg_bucket_all(Gen *gen);

/* layout.c: the memory plan of a plan without a loop: offsets, the slab and
 * each stage's slab. The rest serves microbatch_loop.c's memory plan too. */
void cg_plan_memory(Gen *gen);
uint64_t cg_aligned(uint64_t n); /* up to PLAN_ALIGN */
/* Items 0..n-1 of size[k] alive from first[k] to last[k] (inclusive), each at
 * the lowest offset from base that no item alive with it overlaps, largest
 * first: offsets into off[]; the top. */
uint64_t cg_pack(Gen *gen, int n, const uint64_t *size, const int *first, const int *last,
                 uint64_t base, uint64_t *off);
/* cg_pack with items 0..nfirst-1 placed first, in their order. */
uint64_t cg_pack_after(Gen *gen, int nfirst, int n, const uint64_t *size, const int *first,
                       const int *last, uint64_t base, uint64_t *off);
/* First and last instruction of every tensor (-1: untouched); outputs live to the end. */
void cg_lifetimes(const Gen *gen, int *first, int *last);
/* Whether every stage holds tensor t (stage -1, or an output). */
int cg_everywhere(const Gen *gen, int t);

/* groups.c: independent kernels that run in one parallel region (PlanInstr.group). */
void cg_group_kernels(Gen *gen);
/* The plan's kernel_source (the C prelude, every kernel, the group runner)
 * and gpu_source (CUDA; "" without kernels or when one has no rendering). */
void cg_kernel_sources(Gen *gen, Plan *p);

/* placement.c: the plan's axes placed on the ranks (PlanAxis.stride): --place,
 * else by role and traffic, the tensor axis innermost. After the instructions. */
void cg_place_axes(const Gen *gen, Plan *p);

/* train_hash.c: Plan.train_hash, the same for every mesh of one run ("" when
 * the train block does not read). */
void cg_train_hash(Gen *gen, Plan *p);

/* The loop (microbatch_loop.c): whether the graph is one microbatch of several, with each
 * value's kind (gen->per_mb); each instruction's piece and when (after the
 * stage programs); the memory of a loop plan (instead of cg_plan_memory). */
int cg_loop_find(Gen *gen);
PlanWhen cg_loop_when(const Gen *gen, const Op *op);
PlanWhen cg_loop_msg_when(const Gen *gen, const Op *maker, const Op *reader, int recv);
int cg_loop_pieces(Gen *gen);
int cg_loop_memory(Gen *gen);

/* tensors.c, for lowering: a temporary tensor for intermediate results of a
 * multi-kernel op. */
int gen_temp(Gen *gen, DType t, int rank, const int64_t *shape);
int gen_tensor(Gen *gen, const Value *v); /* the plan tensor holding v */
/* The f32[] hyperparameter tensor called name (made once, default value). */
int gen_hyper(Gen *gen, const char *name, DType t, double value);

/* ---- kernel builder (kbuild.c): nodes are appended with their evaluation statement ---- */
Kernel *kb_new(Gen *gen, KPattern p, int64_t extent, DType ftype);
int kb_arg(Kernel *k, Gen *gen, int tensor);          /* argument slot of a tensor */
int kb_node(Kernel *k, KNodeKind kind, KType t, int a, int b, int c);
int kb_const(Kernel *k, double x);
int kb_iconst(Kernel *k, int64_t x);
int kb_idx(Kernel *k, int level);
int kb_load(Kernel *k, int slot, int index);
void kb_store(Kernel *k, int slot, int index, int value);
void kb_store_add(Kernel *k, int slot, int index, int value);
int kb_loop(Kernel *k, int64_t extent);               /* opens a loop; its id */
void kb_reduce(Kernel *k, int loop, int value, KReduce r);
int kb_end(Kernel *k, int loop);                      /* closes it; the KN_ACC node when it reduced */
void kb_finish(Gen *gen, Kernel *k);                  /* adds the kernel and its launch */
/* dedupe.c: the index in gen->kernels of the kernel k is: one it repeats, or
 * k itself, then named, simplified in place and added. */
int cg_kernel_index(Gen *gen, Kernel *k);

/* float arithmetic shorthands */
int kf(Kernel *k, KNodeKind kind, int a, int b);
int ki(Kernel *k, KNodeKind kind, int a, int b);

/* An elementwise op whose result can be computed inside its user's kernel. */
int cg_fusable(const Op *op);

/* The per-device graph of a partitioned graph (localize.c); g itself on one device. */
const Graph *cg_localize(Arena *a, const Graph *g);

/* One or more kernels computing op's results; -1 when no kernel exists. */
int cg_op_kernels(Gen *gen, const Op *op);
/* kernels.c's helpers for the other lowering files: a value's elements, an
 * op's float type (f64 if any operand or result is, else f32), and the
 * value v at element i of out, computed here when v is fused into out. */
int64_t cg_numel(const Value *v);
DType cg_ftype(const Op *op);
int cg_operand(Kernel *k, Gen *gen, const Value *v, const Value *out, int i);
/* id - offset (the i32[] tensor `offset`) when it lies in [0, V), else 0;
 * *keep is 1 or 0 accordingly (a table or logits split by rows or columns). */
int cg_shifted_id(Kernel *k, Gen *gen, const Value *offset, int id, int64_t V, int *keep);
/* loss_kernels.c: the vocabulary-parallel cross-entropy and its gradient. */
void cg_cross_entropy_shard(Gen *gen, const Op *op);
void cg_cross_entropy_grad_shard(Gen *gen, const Op *op);
/* optimizer_kernels.c: the step's learning rate, SGD and AdamW (one kernel each). */
void cg_learning_rate(Gen *gen, const Op *op);
void cg_sgd(Gen *gen, const Op *op);
void cg_adamw(Gen *gen, const Op *op);

/* emit_attention.c: the GPU renderings of an attention kernel (pattern
 * attention or attention backward): its launch, and its body after the
 * signature that cg_emit_gpu writes. */
CgLaunch cg_attention_launch(const Kernel *k);
void cg_attention_emit(FILE *f, Arena *a, const Kernel *k, CgLang lang);
/* The C type a GPU rendering (emit_gpu.c, emit_attention.c) stores dtype t
 * in (bf16: its 16 bits). */
const char *cg_gpu_storage(DType t);

#endif
