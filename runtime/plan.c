/* plan.c: the plan format: names, the content hash, the checker, the JSON
 * writer and the loader (docs/plan.md).
 * Reads: a Plan in memory (plan_hash, plan_check, plan_write) or a plan.json
 * file (plan_load). Writes: plan.json, atomically (PATH.tmp, fsync, rename),
 * or a heap Plan that plan_free releases.
 * Key idea: the loader trusts nothing. It first reads the JSON into a Plan,
 * checking only what the JSON can say (types, names, integers that fit); then
 * plan_check checks the meaning (ranges, sizes, offsets, operands) on the
 * struct, so a plan built in memory gets the same checks; last the hash, so an
 * edit that leaves a plan valid is refused too. Every message names the field
 * by its path, e.g. "tensors[3].shape". Depends on cJSON and libc only. */
#include "plan/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define JSON_EXACT ((int64_t)1 << 53) /* larger integers are not exact as JSON numbers */
#define MAX_FILE_BYTES ((size_t)1 << 31)
#define NPATTERNS 4
#define NPHASES 4

static const char *const dtype_names[PD_COUNT] = {"f32", "f64", "bf16", "f16", "i32"};
static const size_t dtype_sizes[PD_COUNT] = {4, 8, 2, 2, 4};
static const char *const role_names[PT_COUNT] = {"param", "state", "input", "step",
                                                 "hyper", "temp",  "coord"};
static const char *const kind_names[PI_COUNT] = {"kernel", "gemm", "copy", "collective"};
static const char *const coll_names[PC_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                                 "all_to_all", "slice",      "all_reduce_max",
                                                 "send",       "recv"};
static const char *const init_names[] = {"zeros", "ones", "normal", "uniform", "constant", NULL};

size_t plan_dtype_size(PlanDType t)
{
    return (unsigned)t < PD_COUNT ? dtype_sizes[t] : 0;
}

const char *plan_dtype_name(PlanDType t)
{
    return (unsigned)t < PD_COUNT ? dtype_names[t] : "?";
}

const char *plan_coll_name(PlanCollKind k)
{
    return (unsigned)k < PC_COUNT ? coll_names[k] : "?";
}

const char *plan_instr_label(const Plan *p, int i, char *buf, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    const PlanGemm *g = &in->gemm;
    if (!n)
        return buf;
    switch (in->kind) {
    case PI_KERNEL: snprintf(buf, n, "kernel %s", p->kernels[in->kernel].name); break;
    case PI_GEMM:
        if (g->batch > 1)
            snprintf(buf, n, "gemm %" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " %s", g->m, g->n,
                     g->k, g->batch, plan_dtype_name(p->tensors[g->a].dtype));
        else
            snprintf(buf, n, "gemm %" PRId64 "x%" PRId64 "x%" PRId64 " %s", g->m, g->n, g->k,
                     plan_dtype_name(p->tensors[g->a].dtype));
        break;
    case PI_COPY: snprintf(buf, n, "copy"); break;
    case PI_COLL: snprintf(buf, n, "%s", plan_coll_name(in->coll.op)); break;
    default: snprintf(buf, n, "kind %d", (int)in->kind); break;
    }
    return buf;
}

int64_t plan_mesh_size(const Plan *p)
{
    int64_t n = 1;
    for (int i = 0; p->axes && i < p->naxes; i++)
        n *= p->axes[i].size;
    return n;
}

static int is_pipeline(const PlanAxis *a)
{
    return a->role && !strcmp(a->role, "pipeline");
}

/* The pipeline-role axes in plan order into axes; their count. */
static int pipeline_axes(const Plan *p, int8_t *axes)
{
    int k = 0;
    for (int i = 0; p->axes && i < p->naxes && i < PLAN_MAX_AXES; i++)
        if (is_pipeline(&p->axes[i]))
            axes[k++] = (int8_t)i;
    return k;
}

int plan_stages(const Plan *p)
{
    int64_t n = 1;
    for (int i = 0; p->axes && i < p->naxes; i++)
        if (is_pipeline(&p->axes[i]) && p->axes[i].size > 1)
            n = n > INT_MAX / p->axes[i].size ? INT_MAX : n * p->axes[i].size;
    return (int)n;
}

uint64_t plan_stage_slab(const Plan *p, int stage)
{
    int stages = plan_stages(p);
    if (!p->stage_slab_bytes)
        return p->slab_bytes;
    if (stage >= 0)
        return stage < stages ? p->stage_slab_bytes[stage] : 0;
    uint64_t least = p->slab_bytes;
    for (int s = 0; s < stages; s++)
        least = p->stage_slab_bytes[s] < least ? p->stage_slab_bytes[s] : least;
    return least;
}

int plan_stage_holds(const Plan *p, int stage, int t)
{
    int st = p->tensors[t].stage;
    return st < 0 || st == stage || t == p->loss || t == p->lr || t == p->grad_norm;
}

static int is_p2p(PlanCollKind k)
{
    return k == PC_SEND || k == PC_RECV;
}

const char *plan_role_name(PlanRole r)
{
    return (unsigned)r < PT_COUNT ? role_names[r] : "?";
}

static const char *str_or_empty(const char *s)
{
    return s ? s : "";
}

/* A name from the file, fit to quote in a one-line message: control bytes
 * become '?', and a long one is cut. b has room for SHOWN bytes. */
#define SHOWN 48
static const char *shown(char *b, const char *s)
{
    size_t i = 0;
    for (s = str_or_empty(s); *s && i < 40; s++)
        b[i++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    strcpy(b + i, *s ? "..." : "");
    return b;
}

/* Writes the message into err (if it has room) and returns -1. */
int plan_errorf(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    if (err && n) {
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- the hash: FNV-1a 64 over the canonical serialisation (docs/plan.md) ---- */

typedef struct Fnv {
    uint64_t h;
} Fnv;

static void fnv_bytes(Fnv *f, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) {
        f->h ^= b[i];
        f->h *= 0x100000001b3ULL;
    }
}

/* Every integer is 8 bytes little-endian, two's complement. */
static void fnv_u64(Fnv *f, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    fnv_bytes(f, b, 8);
}

static void fnv_i64(Fnv *f, int64_t v)
{
    fnv_u64(f, (uint64_t)v);
}

/* A double is its IEEE-754 bits; -0 counts as +0 (JSON writes both as 0). */
static void fnv_f64(Fnv *f, double d)
{
    uint64_t u;
    if (d == 0)
        d = 0;
    memcpy(&u, &d, 8);
    fnv_u64(f, u);
}

/* A string is its length then its bytes; NULL counts as "". */
static void fnv_str(Fnv *f, const char *s)
{
    size_t n = strlen(str_or_empty(s));
    fnv_u64(f, n);
    fnv_bytes(f, str_or_empty(s), n);
}

static void hash_tensor(Fnv *f, const PlanTensor *t)
{
    int rank = t->rank < 0 ? 0 : t->rank > PLAN_MAX_RANK ? PLAN_MAX_RANK : t->rank;
    fnv_str(f, t->name);
    fnv_i64(f, t->dtype);
    fnv_i64(f, rank);
    for (int d = 0; d < rank; d++)
        fnv_i64(f, t->shape[d]);
    fnv_u64(f, t->offset);
    fnv_u64(f, t->bytes);
    fnv_i64(f, t->role);
    fnv_str(f, t->init);
    fnv_f64(f, t->init_arg);
    fnv_i64(f, t->layer);
    fnv_i64(f, t->limit);
    fnv_i64(f, t->value);
    for (int d = 0; d < rank; d++) {
        int k = t->nsplit[d] > PLAN_MAX_AXES ? PLAN_MAX_AXES : t->nsplit[d];
        fnv_i64(f, k);
        for (int j = 0; j < k; j++)
            fnv_i64(f, t->split[d][j]);
    }
    int nc = t->ncoord < 0 ? 0 : t->ncoord > PLAN_MAX_AXES ? PLAN_MAX_AXES : t->ncoord;
    fnv_i64(f, nc);
    for (int j = 0; j < nc; j++)
        fnv_i64(f, t->coord[j]);
    fnv_i64(f, t->stage);
    fnv_i64(f, t->frame);
}

static void hash_gemm(Fnv *f, const PlanGemm *g)
{
    int64_t v[] = {g->a,   g->b,   g->c,   g->trans_a, g->trans_b,  g->m,        g->n,       g->k,
                   g->lda, g->ldb, g->ldc, g->batch,   g->stride_a, g->stride_b, g->stride_c};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        fnv_i64(f, v[i]);
    fnv_f64(f, g->alpha);
    fnv_f64(f, g->beta);
    fnv_i64(f, g->epilogue);
    if (g->epilogue == PE_BIAS)
        fnv_i64(f, g->bias);
}

/* Only the fields an instruction's kind uses are part of it. */
static void hash_instr(Fnv *f, const PlanInstr *in)
{
    int nargs = in->args && in->nargs > 0 ? in->nargs : 0;
    fnv_i64(f, in->kind);
    fnv_i64(f, in->phase);
    fnv_i64(f, in->layer);
    fnv_i64(f, in->stage);
    fnv_i64(f, nargs);
    for (int j = 0; j < nargs; j++)
        fnv_i64(f, in->args[j]);
    fnv_i64(f, in->piece);
    fnv_i64(f, in->when);
    fnv_i64(f, in->acc);
    fnv_i64(f, in->rows);
    if (in->kind == PI_KERNEL)
        fnv_i64(f, in->kernel), fnv_i64(f, in->group);
    if (in->kind == PI_GEMM)
        hash_gemm(f, &in->gemm);
    if (in->kind == PI_COLL) {
        const PlanColl *c = &in->coll;
        int na = c->naxes < 0 ? 0 : c->naxes > PLAN_MAX_AXES ? PLAN_MAX_AXES : c->naxes;
        fnv_i64(f, c->op);
        fnv_i64(f, na);
        for (int j = 0; j < na; j++)
            fnv_i64(f, c->axes[j]);
        fnv_i64(f, c->dim);
        fnv_i64(f, c->dim2);
        fnv_i64(f, c->bytes);
        if (is_p2p(c->op)) {
            fnv_i64(f, c->peer);
            fnv_i64(f, c->tag);
        }
    }
}

/* Elements of t before dimension dim: the rows a gather along dim interleaves. */
static uint64_t outer_rows(const PlanTensor *t, int dim)
{
    uint64_t pre = 1;
    for (int d = 0; d < dim && d < t->rank; d++)
        pre *= (uint64_t)t->shape[d];
    return pre;
}

/* Whether a copy's tensors may share a byte: within the slab by their
 * offsets; a loop plan's frame tensors sit at a microbatch's base, unknown
 * here, so they may. */
static int may_overlap(const PlanTensor *a, const PlanTensor *b)
{
    if (a->frame > 0 || b->frame > 0)
        return 1;
    return a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

uint64_t plan_instr_scratch(const Plan *p, const PlanInstr *in, int cuda)
{
    if (!cuda) {
        uint64_t k = 0, sum = 0;
        if (in->kind != PI_COLL)
            return 0;
        if (in->coll.op == PC_ALL_TO_ALL)
            k = 2 * p->tensors[in->args[0]].bytes;
        for (int a = 0; in->nargs > 2 && a < in->nargs; a += 2)
            sum += p->tensors[in->args[a]].bytes;
        return sum > k ? sum : k;
    }
    if (in->nargs < 2)
        return 0;
    const PlanTensor *a = &p->tensors[in->args[0]], *b = &p->tensors[in->args[1]];
    if (in->kind == PI_COPY) {
        int same = a->offset == b->offset && a->frame == b->frame && a->frame <= 0;
        return !same && may_overlap(a, b) ? a->bytes : 0;
    }
    if (in->kind != PI_COLL)
        return 0;
    switch (in->coll.op) {
    case PC_ALL_GATHER:
        return outer_rows(a, in->coll.dim) > 1 ? b->bytes : 0;
    case PC_REDUCE_SCATTER:
        return outer_rows(b, in->coll.dim) > 1 ? a->bytes : 0;
    case PC_ALL_TO_ALL:
        return 2 * a->bytes;
    default:
        return 0;
    }
}

uint64_t plan_scratch_bytes(const Plan *p, int cuda)
{
    uint64_t need = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        uint64_t k = plan_instr_scratch(p, &p->instrs[i], cuda);
        need = k > need ? k : need;
    }
    return need;
}

void plan_hash(const Plan *p, char out[17])
{
    Fnv f = {0xcbf29ce484222325ULL};
    int nax = p->axes ? p->naxes : 0, nt = p->tensors ? p->ntensors : 0;
    int ni = p->instrs ? p->ninstrs : 0, nk = p->kernels ? p->nkernels : 0;
    fnv_i64(&f, p->version);
    fnv_str(&f, p->model);
    fnv_str(&f, p->train_hash);
    fnv_i64(&f, nax < 0 ? 0 : nax);
    for (int i = 0; i < nax; i++) {
        fnv_str(&f, p->axes[i].name);
        fnv_str(&f, p->axes[i].role);
        fnv_i64(&f, p->axes[i].size);
    }
    fnv_u64(&f, p->slab_bytes);
    int stages = plan_stages(p);
    fnv_i64(&f, stages);
    for (int s = 0; s < stages; s++)
        fnv_u64(&f, plan_stage_slab(p, s));
    fnv_i64(&f, nt < 0 ? 0 : nt);
    for (int i = 0; i < nt; i++)
        hash_tensor(&f, &p->tensors[i]);
    fnv_i64(&f, ni < 0 ? 0 : ni);
    for (int i = 0; i < ni; i++)
        hash_instr(&f, &p->instrs[i]);
    fnv_i64(&f, nk < 0 ? 0 : nk);
    for (int i = 0; i < nk; i++) {
        fnv_str(&f, p->kernels[i].name);
        fnv_i64(&f, p->kernels[i].nargs);
        fnv_i64(&f, p->kernels[i].pattern);
        fnv_i64(&f, p->kernels[i].grid);
        fnv_i64(&f, p->kernels[i].block);
    }
    fnv_str(&f, p->kernel_source);
    fnv_str(&f, p->gpu_source);
    fnv_i64(&f, p->loss);
    fnv_i64(&f, p->lr);
    fnv_i64(&f, p->grad_norm);
    fnv_f64(&f, p->flops);
    fnv_i64(&f, p->steps);
    fnv_i64(&f, p->seed);
    fnv_i64(&f, p->nsched > 0 ? p->microbatches : 0); /* a plain plan: not written, not read */
    fnv_i64(&f, p->nsched > 0 ? p->ntags : 0);
    int nsched = p->sched ? p->nsched : 0, nframes = p->frames ? p->nframes : 0;
    fnv_i64(&f, nsched < 0 ? 0 : nsched);
    for (int i = 0; i < nsched; i++) {
        fnv_i64(&f, p->sched[i].stage);
        fnv_i64(&f, p->sched[i].piece);
        fnv_i64(&f, p->sched[i].mb);
    }
    fnv_i64(&f, nframes < 0 ? 0 : nframes);
    for (int i = 0; i < nframes; i++) {
        fnv_i64(&f, p->frames[i].stage);
        fnv_u64(&f, p->frames[i].bytes);
        for (int j = 0; p->frames[i].base && j < p->microbatches; j++)
            fnv_u64(&f, p->frames[i].base[j]);
    }
    snprintf(out, 17, "%016" PRIx64, f.h);
}

/* ---- plan_check: the meaning of a plan, on the struct ---- */

int plan_is_keys(const PlanTensor *t)
{
    return t->role == PT_INPUT && t->init && !strcmp(t->init, "keys") && t->dtype == PD_I32 &&
           t->rank == 1;
}

static int is_init_name(const char *s)
{
    for (int i = 0; init_names[i]; i++)
        if (!strcmp(s, init_names[i]))
            return 1;
    return 0;
}

/* Elements of t, or -1 when its shape is negative or overflows. */
static int64_t numel_of(const PlanTensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        if (t->shape[d] < 0 || __builtin_mul_overflow(n, t->shape[d], &n))
            return -1;
    return n;
}

static int check_tensor_shape(const Plan *p, int i, char *err, size_t n)
{
    const PlanTensor *t = &p->tensors[i];
    uint64_t want;
    if ((unsigned)t->dtype >= PD_COUNT)
        return plan_errorf(err, n, "tensors[%d].dtype: %d is not a dtype", i, (int)t->dtype);
    if ((unsigned)t->role >= PT_COUNT)
        return plan_errorf(err, n, "tensors[%d].role: %d is not a role", i, (int)t->role);
    if (t->rank < 0 || t->rank > PLAN_MAX_RANK)
        return plan_errorf(err, n, "tensors[%d].rank: %d is outside [0, %d]", i, t->rank, PLAN_MAX_RANK);
    int64_t ne = numel_of(t);
    if (ne < 0 || __builtin_mul_overflow((uint64_t)ne, plan_dtype_size(t->dtype), &want))
        return plan_errorf(err, n, "tensors[%d].shape: negative or too large", i);
    if (t->bytes != want)
        return plan_errorf(err, n,
                   "tensors[%d].bytes: %" PRIu64 ", but %" PRId64 " elements of %s take %" PRIu64,
                   i, t->bytes, ne, plan_dtype_name(t->dtype), want);
    if (t->frame == -1 ? t->offset % plan_dtype_size(t->dtype) : t->offset % PLAN_ALIGN)
        return plan_errorf(err, n, "tensors[%d].offset: %" PRIu64 " is not a multiple of %d", i, t->offset,
                   t->frame == -1 ? (int)plan_dtype_size(t->dtype) : PLAN_ALIGN);
    int everywhere = i == p->loss || i == p->lr || i == p->grad_norm; /* broadcast targets */
    int stage = everywhere || t->stage < -1 || t->stage >= plan_stages(p) ? -1 : t->stage;
    uint64_t slab = plan_stage_slab(p, stage);
    if (t->frame < (p->nsched > 0 ? 0 : -1) || t->frame > (p->frames && p->nsched > 0 ? p->nframes : 0))
        return plan_errorf(err, n, "tensors[%d].frame: %d is not a frame", i, t->frame);
    if (t->frame == -1 && t->role != PT_TEMP)
        return plan_errorf(err, n, "tensors[%d].frame: -1 (an input's rows) on a %s tensor", i,
                           role_names[t->role]);
    if (t->frame > 0) {
        const PlanFrame *f = &p->frames[t->frame - 1];
        if (t->role != PT_TEMP || (plan_stages(p) > 1 && f->stage != t->stage))
            return plan_errorf(err, n, "tensors[%d].frame: only a temporary of the frame's stage "
                                       "lies in a frame", i);
        if (t->offset > f->bytes || t->bytes > f->bytes - t->offset)
            return plan_errorf(err, n,
                               "tensors[%d].offset: bytes [%" PRIu64 ", %" PRIu64
                               ") lie outside its frame (%" PRIu64 " bytes)",
                               i, t->offset, t->offset + t->bytes, f->bytes);
        return 0;
    }
    if (t->offset > slab || t->bytes > slab - t->offset)
        return plan_errorf(err, n,
                           "tensors[%d].offset: bytes [%" PRIu64 ", %" PRIu64
                           ") lie outside the slab (%" PRIu64 " bytes%s)",
                           i, t->offset, t->offset + t->bytes, slab,
                           p->stage_slab_bytes && plan_stages(p) > 1
                               ? stage < 0 ? " on some stage" : " on its stage"
                               : "");
    return 0;
}

static int check_tensor_role(const Plan *p, int i, char *err, size_t n)
{
    const PlanTensor *t = &p->tensors[i];
    const char *init = str_or_empty(t->init);
    char q[SHOWN];
    if (t->role != PT_TEMP && !*str_or_empty(t->name))
        return plan_errorf(err, n, "tensors[%d].name: a %s tensor needs a name", i, role_names[t->role]);
    if (t->role == PT_PARAM ? !is_init_name(init) : *init != 0 && !plan_is_keys(t))
        return plan_errorf(err, n, "tensors[%d].init: \"%s\" is not %s", i, shown(q, init),
                   t->role == PT_PARAM ? "zeros, ones, normal, uniform or constant"
                                       : "\"\" (only params have an init)");
    if (!isfinite(t->init_arg) ||
        (t->init_arg < 0 && (!strcmp(init, "normal") || !strcmp(init, "uniform"))))
        return plan_errorf(err, n, "tensors[%d].init_arg: %g is out of range", i, t->init_arg);
    if (t->limit < 0 || (t->limit > 0 && (t->role != PT_INPUT || t->dtype != PD_I32)))
        return plan_errorf(err, n, "tensors[%d].limit: %" PRId64 " (only i32 inputs have a limit > 0)", i,
                   t->limit);
    if (t->role == PT_STEP && (t->dtype != PD_F32 || t->rank != 0))
        return plan_errorf(err, n, "tensors[%d]: a step tensor must be f32[]", i);
    if (t->role == PT_HYPER && ((t->dtype != PD_F32 && t->dtype != PD_F64) || t->rank != 0))
        return plan_errorf(err, n, "tensors[%d]: a hyper tensor must be f32[] or f64[]", i);
    if (t->layer < -1 || t->value < -1)
        return plan_errorf(err, n, "tensors[%d].%s: must be >= -1", i, t->layer < -1 ? "layer" : "value");
    return 0;
}

typedef struct Named {
    const char *name;
    int index;
} Named;

static int named_cmp(const void *a, const void *b)
{
    const Named *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Sorts v[0..m) by name; the first name used twice: 1 with its two indices. */
static int find_duplicate(Named *v, int m, int *first, int *second)
{
    qsort(v, (size_t)m, sizeof *v, named_cmp);
    for (int j = 1; j < m; j++)
        if (!strcmp(v[j].name, v[j - 1].name)) {
            *first = v[j - 1].index;
            *second = v[j].index;
            return 1;
        }
    return 0;
}

/* Parameters, state, inputs and step tensors are found by name: names are unique.
 * Kernel names are symbols: unique too. */
static int check_names(const Plan *p, char *err, size_t n)
{
    int m = 0, a, b, rc = 0;
    char q[SHOWN];
    Named *v = malloc(sizeof(Named) * ((size_t)p->ntensors + (size_t)p->nkernels + 1));
    if (!v)
        return plan_errorf(err, n, "malloc: out of memory");
    for (int i = 0; i < p->ntensors; i++)
        if (p->tensors[i].role != PT_TEMP)
            v[m++] = (Named){str_or_empty(p->tensors[i].name), i};
    if (find_duplicate(v, m, &a, &b))
        rc = plan_errorf(err, n, "tensors[%d].name: \"%s\" is also the name of tensors[%d]", b,
                 shown(q, p->tensors[b].name), a);
    m = 0;
    for (int i = 0; i < p->nkernels; i++)
        v[m++] = (Named){str_or_empty(p->kernels[i].name), i};
    if (!rc && find_duplicate(v, m, &a, &b))
        rc = plan_errorf(err, n, "kernels[%d].name: \"%s\" is also the name of kernels[%d]", b,
                 shown(q, p->kernels[b].name), a);
    free(v);
    return rc;
}

static int is_identifier(const char *s)
{
    if (!s || !(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
        return 0;
    for (s++; *s; s++)
        if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9')))
            return 0;
    return 1;
}

static int check_kernels(const Plan *p, char *err, size_t n)
{
    char q[SHOWN];
    for (int i = 0; i < p->nkernels; i++) {
        const PlanKernel *k = &p->kernels[i];
        if (!is_identifier(k->name))
            return plan_errorf(err, n, "kernels[%d].name: \"%s\" is not a C identifier", i,
                       shown(q, k->name));
        if (k->nargs < 0 || k->pattern < 0 || k->pattern >= NPATTERNS)
            return plan_errorf(err, n, "kernels[%d].%s: out of range", i,
                       k->nargs < 0 ? "nargs" : "pattern");
        if (k->grid < 0 || k->grid > INT32_MAX || k->block < 0 || k->block > 1024 ||
            (k->grid == 0) != (k->block == 0))
            return plan_errorf(err, n, "kernels[%d]: grid %" PRId64 " of block %d is not a launch "
                               "(grid in [1, 2^31), block in [1, 1024], or both 0)", i, k->grid,
                               k->block);
    }
    return 0;
}

static int check_tensor_index(const Plan *p, int t, const char *what, int i, char *err, size_t n)
{
    if (t < 0 || t >= p->ntensors)
        return plan_errorf(err, n, "instrs[%d].%s: tensor %d out of range (%d tensors)", i, what, t,
                   p->ntensors);
    return 0;
}

/* The operand X of a GEMM spans rows x cols with leading dimension ld, batch
 * times stride apart: its last element touched must lie inside the tensor. */
static int check_operand(const Plan *p, int i, char name, int t, int64_t rows, int64_t cols,
                         int64_t ld, int64_t stride, int64_t batch, char *err, size_t n)
{
    int64_t last = 0, a = 0, b = 0;
    const PlanTensor *pt = &p->tensors[t];
    if (ld < cols)
        return plan_errorf(err, n, "instrs[%d].gemm.ld%c: %" PRId64 " is less than %" PRId64, i,
                   name + 'a' - 'A', ld, cols);
    if (stride < 0)
        return plan_errorf(err, n, "instrs[%d].gemm.stride_%c: %" PRId64 " is negative", i,
                   name + 'a' - 'A', stride);
    int ovf = __builtin_mul_overflow(batch - 1, stride, &a) ||
              __builtin_mul_overflow(rows - 1, ld, &b) || __builtin_add_overflow(a, b, &last) ||
              __builtin_add_overflow(last, cols - 1, &last);
    if (ovf || last >= numel_of(pt))
        return plan_errorf(err, n,
                   "instrs[%d].gemm: %c (tensors[%d], %" PRId64
                   " elements) is too small: the gemm touches element %s%" PRId64,
                   i, name, t, numel_of(pt), ovf ? "beyond " : "", ovf ? INT64_MAX : last);
    return 0;
}

static int check_gemm(const Plan *p, int i, char *err, size_t n)
{
    const PlanGemm *g = &p->instrs[i].gemm;
    if (check_tensor_index(p, g->a, "gemm.a", i, err, n) ||
        check_tensor_index(p, g->b, "gemm.b", i, err, n) ||
        check_tensor_index(p, g->c, "gemm.c", i, err, n))
        return -1;
    PlanDType ta = p->tensors[g->a].dtype, tb = p->tensors[g->b].dtype, tc = p->tensors[g->c].dtype;
    if (ta != tb || (ta != tc && !(ta == PD_BF16 && tc == PD_F32)) || ta == PD_I32)
        return plan_errorf(err, n,
                   "instrs[%d].gemm: operands are %s, %s and %s; A and B must share one float "
                   "dtype, and C be that dtype (or f32 when A and B are bf16)",
                   i, plan_dtype_name(ta), plan_dtype_name(tb), plan_dtype_name(tc));
    if (g->epilogue != PE_NONE && g->epilogue != PE_BIAS)
        return plan_errorf(err, n, "instrs[%d].gemm.epilogue: %d is not an epilogue", i,
                           g->epilogue);
    if (g->epilogue == PE_BIAS) {
        if (check_tensor_index(p, g->bias, "gemm.bias", i, err, n))
            return -1;
        const PlanTensor *b = &p->tensors[g->bias];
        if (b->dtype != tc || numel_of(b) != g->n || g->beta != 0)
            return plan_errorf(err, n, "instrs[%d].gemm.bias: tensors[%d] must be %" PRId64
                               " elements of %s, with beta 0", i, g->bias, g->n,
                               plan_dtype_name(tc));
    }
    if ((g->trans_a != 0 && g->trans_a != 1) || (g->trans_b != 0 && g->trans_b != 1))
        return plan_errorf(err, n, "instrs[%d].gemm.trans_%c: must be 0 or 1", i,
                   g->trans_a != 0 && g->trans_a != 1 ? 'a' : 'b');
    if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch < 1)
        return plan_errorf(err, n, "instrs[%d].gemm: m, n, k and batch must be >= 1", i);
    if (!isfinite(g->alpha) || !isfinite(g->beta))
        return plan_errorf(err, n, "instrs[%d].gemm: alpha and beta must be finite", i);
    if (check_operand(p, i, 'A', g->a, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda,
                      g->stride_a, g->batch, err, n) ||
        check_operand(p, i, 'B', g->b, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb,
                      g->stride_b, g->batch, err, n))
        return -1;
    return check_operand(p, i, 'C', g->c, g->m, g->n, g->ldc, g->stride_c, g->batch, err, n);
}

static int check_coll(const Plan *p, int i, char *err, size_t n);

static int check_instr(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    if ((unsigned)in->kind >= PI_COUNT)
        return plan_errorf(err, n, "instrs[%d].kind: %d is not an instruction kind", i, (int)in->kind);
    if (in->phase < 0 || in->phase >= NPHASES || in->layer < -1)
        return plan_errorf(err, n, "instrs[%d].%s: out of range", i, in->layer < -1 ? "layer" : "phase");
    if (in->stage < 0 || in->stage >= plan_stages(p))
        return plan_errorf(err, n, "instrs[%d].stage: %d is outside [0, %d)", i, in->stage,
                           plan_stages(p));
    if (in->nargs < 0 || (in->nargs > 0 && !in->args))
        return plan_errorf(err, n, "instrs[%d].args: %d arguments but no array", i, in->nargs);
    for (int j = 0; j < in->nargs; j++) {
        if (check_tensor_index(p, in->args[j], "args", i, err, n))
            return -1;
        if (p->tensors[in->args[j]].frame == -1 && (in->kind != PI_COPY || j != 1))
            return plan_errorf(err, n, "instrs[%d].args[%d]: an input's rows are only a copy's "
                                       "source", i, j);
    }
    if (in->kind == PI_GEMM) {
        const PlanGemm *g = &in->gemm;
        int gt[4] = {g->a, g->b, g->c, g->epilogue == PE_BIAS ? g->bias : g->a};
        for (int j = 0; j < 4; j++)
            if (gt[j] >= 0 && gt[j] < p->ntensors && p->tensors[gt[j]].frame == -1)
                return plan_errorf(err, n, "instrs[%d].gemm: an input's rows are only a copy's "
                                           "source", i);
        return check_gemm(p, i, err, n);
    }
    if (in->kind == PI_COLL)
        return check_coll(p, i, err, n);
    if (in->kind == PI_COPY) {
        if (in->nargs != 2)
            return plan_errorf(err, n, "instrs[%d].args: a copy takes 2 tensors, not %d", i, in->nargs);
        if (in->rows && p->nsched > 0) /* one microbatch's rows: check_loop */
            return 0;
        if (p->tensors[in->args[0]].bytes != p->tensors[in->args[1]].bytes)
            return plan_errorf(err, n, "instrs[%d]: copy of %" PRIu64 " bytes into a tensor of %" PRIu64, i,
                       p->tensors[in->args[1]].bytes, p->tensors[in->args[0]].bytes);
        return 0;
    }
    if (in->kernel < 0 || in->kernel >= p->nkernels)
        return plan_errorf(err, n, "instrs[%d].kernel: %d out of range (%d kernels)", i, in->kernel,
                   p->nkernels);
    if (in->nargs != p->kernels[in->kernel].nargs)
        return plan_errorf(err, n, "instrs[%d].args: %d arguments, but kernel \"%s\" takes %d", i,
                   in->nargs, p->kernels[in->kernel].name, p->kernels[in->kernel].nargs);
    if (in->group == 1 || in->group < 0 || in->group > p->ninstrs - i)
        return plan_errorf(err, n, "instrs[%d].group: %d is not a group of the instructions that "
                                   "follow", i, in->group);
    for (int j = i; j < i + in->group; j++) {
        const PlanInstr *m = &p->instrs[j];
        if (m->kind != PI_KERNEL || m->stage != in->stage || m->piece != in->piece)
            return plan_errorf(err, n, "instrs[%d].group: instrs[%d] is not a kernel of its %s", i,
                               j, m->kind == PI_KERNEL && m->stage == in->stage ? "piece" : "stage");
        if (p->nsched > 0 && (m->when != in->when || m->acc))
            return plan_errorf(err, n, "instrs[%d].group: instrs[%d] does not run with the "
                                       "group's first", i, j);
    }
    return 0;
}

/* loss, lr and grad_norm: -1, or a rank-0 float tensor. */
static int check_output(const Plan *p, const char *what, int t, char *err, size_t n)
{
    if (t == -1)
        return 0;
    if (t < 0 || t >= p->ntensors)
        return plan_errorf(err, n, "%s: tensor %d out of range (%d tensors)", what, t, p->ntensors);
    const PlanTensor *pt = &p->tensors[t];
    if (pt->rank != 0 || (pt->dtype != PD_F32 && pt->dtype != PD_F64))
        return plan_errorf(err, n, "%s: tensors[%d] must be a rank-0 f32 or f64 tensor", what, t);
    return 0;
}

/* Each stage's slab within slab_bytes, the largest equal to it. */
static int check_stage_slabs(const Plan *p, char *err, size_t n)
{
    uint64_t most = 0;
    for (int s = 0; p->stage_slab_bytes && s < plan_stages(p); s++) {
        if (p->stage_slab_bytes[s] > p->slab_bytes)
            return plan_errorf(err, n,
                               "stage_slab_bytes[%d]: %" PRIu64 " is more than slab_bytes %" PRIu64,
                               s, p->stage_slab_bytes[s], p->slab_bytes);
        most = p->stage_slab_bytes[s] > most ? p->stage_slab_bytes[s] : most;
    }
    if (p->stage_slab_bytes && most != p->slab_bytes)
        return plan_errorf(err, n,
                           "slab_bytes: %" PRIu64 ", but the largest stage slab is %" PRIu64,
                           p->slab_bytes, most);
    return 0;
}

/* An instruction of stage s touches only tensors that its devices hold. */
static int check_instr_stage(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    int t[4] = {in->gemm.a, in->gemm.b, in->gemm.c, in->gemm.bias}, nt = 0;
    if (in->kind == PI_GEMM)
        nt = in->gemm.epilogue == PE_BIAS ? 4 : 3;
    for (int j = 0; j < in->nargs + nt; j++) {
        int k = j < in->nargs ? in->args[j] : t[j - in->nargs];
        if (!plan_stage_holds(p, in->stage, k))
            return plan_errorf(err, n,
                               "instrs[%d]: an instruction of stage %d touches "
                               "tensors[%d] of stage %d",
                               i, in->stage, k, p->tensors[k].stage);
    }
    return 0;
}

static int check_counts(const Plan *p, char *err, size_t n)
{
    if (p->version != PLAN_VERSION)
        return plan_errorf(err, n,
                           "version: %d, expected %d (a plan of format version %d is not read "
                           "by this runtime: compile it again)",
                           p->version, PLAN_VERSION, p->version);
    if (p->naxes < 0 || (p->naxes > 0 && !p->axes))
        return plan_errorf(err, n, "axes: bad count %d", p->naxes);
    if (p->ntensors < 0 || (p->ntensors > 0 && !p->tensors))
        return plan_errorf(err, n, "tensors: bad count %d", p->ntensors);
    if (p->ninstrs < 0 || (p->ninstrs > 0 && !p->instrs))
        return plan_errorf(err, n, "instrs: bad count %d", p->ninstrs);
    if (p->nkernels < 0 || (p->nkernels > 0 && !p->kernels))
        return plan_errorf(err, n, "kernels: bad count %d", p->nkernels);
    if (!isfinite(p->flops) || p->flops < 0)
        return plan_errorf(err, n, "flops: %g is out of range", p->flops);
    for (int i = 0; i < p->naxes; i++)
        if (!*str_or_empty(p->axes[i].name) || p->axes[i].size < 1)
            return plan_errorf(err, n, "axes[%d]: needs a name and a size >= 1", i);
    if (*p->train_hash && strspn(p->train_hash, "0123456789abcdef") != 16)
        return plan_errorf(err, n, "train_hash: expected 16 lowercase hex digits or \"\"");
    return check_stage_slabs(p, err, n);
}

/* Axes in range and each used once (used: a mask carried across calls). */
static int check_axes(const Plan *p, const int8_t *axes, int na, uint32_t *used, const char *at,
                      int i, char *err, size_t n)
{
    if (na < 0 || na > PLAN_MAX_AXES)
        return plan_errorf(err, n, "%s[%d]: %d axes", at, i, na);
    for (int j = 0; j < na; j++) {
        if (axes[j] < 0 || axes[j] >= p->naxes)
            return plan_errorf(err, n, "%s[%d]: axis %d out of range (%d axes)", at, i, axes[j],
                               p->naxes);
        if (*used >> axes[j] & 1)
            return plan_errorf(err, n, "%s[%d]: axis %d used twice", at, i, axes[j]);
        *used |= 1u << axes[j];
    }
    return 0;
}

static int64_t axes_size(const Plan *p, const int8_t *axes, int na)
{
    int64_t s = 1;
    for (int j = 0; j < na; j++)
        s *= p->axes[axes[j]].size;
    return s;
}

static int check_tensor_split(const Plan *p, int i, char *err, size_t n)
{
    const PlanTensor *t = &p->tensors[i];
    uint32_t used = 0;
    for (int d = 0; d < t->rank; d++)
        if (check_axes(p, t->split[d], t->nsplit[d], &used, "tensors", i, err, n))
            return -1;
    used = 0;
    if (check_axes(p, t->coord, t->ncoord, &used, "tensors", i, err, n))
        return -1;
    if (t->role == PT_COORD && (t->dtype != PD_I32 || t->rank != 0))
        return plan_errorf(err, n, "tensors[%d]: a coord tensor must be i32[]", i);
    if (t->stage < -1 || t->stage >= plan_stages(p))
        return plan_errorf(err, n, "tensors[%d].stage: %d is outside [-1, %d)", i, t->stage,
                           plan_stages(p));
    for (int d = 0; t->stage >= 0 && d < t->rank; d++) /* its blocks all live on one stage */
        for (int j = 0; j < t->nsplit[d]; j++)
            if (is_pipeline(&p->axes[t->split[d][j]]))
                return plan_errorf(err, n,
                                   "tensors[%d].split: a tensor of stage %d is split over "
                                   "the pipeline axis %d",
                                   i, t->stage, t->split[d][j]);
    return 0;
}

/* A send or recv: one tensor, over exactly the pipeline axes, to another stage. */
static int check_p2p(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    const PlanColl *c = &in->coll;
    const char *what = coll_names[c->op];
    int8_t pipe[PLAN_MAX_AXES];
    int np = pipeline_axes(p, pipe), stages = plan_stages(p);
    if (in->nargs != 1)
        return plan_errorf(err, n, "instrs[%d].args: a %s takes 1 tensor, not %d", i, what,
                           in->nargs);
    if (c->naxes != np || memcmp(c->axes, pipe, (size_t)np))
        return plan_errorf(err, n,
                           "instrs[%d].coll.axes: a %s runs over the pipeline axes (those "
                           "of role \"pipeline\", in order)",
                           i, what);
    if (c->peer < 0 || c->peer >= stages)
        return plan_errorf(err, n, "instrs[%d].coll.peer: %d is outside [0, %d)", i, c->peer,
                           stages);
    if (c->peer == in->stage)
        return plan_errorf(err, n, "instrs[%d].coll.peer: %d is the instruction's own stage", i,
                           c->peer);
    if (c->tag < 0 || c->tag > 32767)
        return plan_errorf(err, n, "instrs[%d].coll.tag: %d is outside [0, 32767]", i, c->tag);
    return 0;
}

/* A collective's two tensors agree with its kind, dims and group size. */
static int check_coll(const Plan *p, int i, char *err, size_t n)
{
    const PlanInstr *in = &p->instrs[i];
    const PlanColl *c = &in->coll;
    uint32_t used = 0;
    if ((unsigned)c->op >= PC_COUNT)
        return plan_errorf(err, n, "instrs[%d].op: %d is not a collective", i, (int)c->op);
    if (is_p2p(c->op))
        return check_p2p(p, i, err, n);
    if (in->nargs < 2 || in->nargs % 2 || (in->nargs > 2 && c->op != PC_ALL_REDUCE))
        return plan_errorf(err, n, "instrs[%d].args: a collective takes 2 tensors (an all_reduce "
                                   "bucket: pairs), not %d", i, in->nargs);
    if (check_axes(p, c->axes, c->naxes, &used, "instrs", i, err, n))
        return -1;
    for (int j = 2; j < in->nargs; j += 2) { /* the pairs of a bucket: equal, one dtype */
        const PlanTensor *x = &p->tensors[in->args[j]], *y = &p->tensors[in->args[j + 1]];
        if (x->bytes != y->bytes || x->dtype != y->dtype ||
            x->dtype != p->tensors[in->args[0]].dtype)
            return plan_errorf(err, n, "instrs[%d].args: bucket pair %d differs in size or dtype",
                               i, j / 2);
    }
    const PlanTensor *a = &p->tensors[in->args[0]], *b = &p->tensors[in->args[1]];
    int64_t k = axes_size(p, c->axes, c->naxes);
    if (a->dtype != b->dtype || a->rank != b->rank)
        return plan_errorf(err, n, "instrs[%d]: %s between tensors of another dtype or rank", i,
                           coll_names[c->op]);
    int whole = c->op == PC_ALL_REDUCE || c->op == PC_ALL_REDUCE_MAX;
    int d1 = whole ? -1 : c->dim, d2 = c->op == PC_ALL_TO_ALL ? c->dim2 : -1;
    if ((!whole && (d1 < 0 || d1 >= a->rank)) ||
        (c->op == PC_ALL_TO_ALL && (d2 < 0 || d2 >= a->rank || d2 == d1)))
        return plan_errorf(err, n, "instrs[%d].dim: out of range", i);
    for (int d = 0; d < a->rank; d++) {
        int64_t x = a->shape[d], y = b->shape[d];
        int ok = x == y;
        if (d == d1)
            ok = c->op == PC_ALL_GATHER || c->op == PC_ALL_TO_ALL ? y == x * k : x == y * k;
        if (d == d2)
            ok = x == y * k;
        if (!ok)
            return plan_errorf(err, n, "instrs[%d]: %s over %lld devices cannot take %s[%d] of "
                                       "size %lld to size %lld",
                               i, coll_names[c->op], (long long)k, "dim", d, (long long)x,
                               (long long)y);
    }
    if ((whole || c->op == PC_REDUCE_SCATTER) && a->dtype != PD_F32 &&
        a->dtype != PD_F64 && a->dtype != PD_I32 && a->dtype != PD_BF16)
        return plan_errorf(err, n, "instrs[%d]: %s of %s", i, coll_names[c->op],
                           dtype_names[a->dtype]);
    return 0;
}

static int by_sched(const void *x, const void *y)
{
    const PlanSched *a = x, *b = y;
    if (a->stage != b->stage)
        return a->stage - b->stage;
    if (a->piece != b->piece)
        return a->piece < b->piece ? -1 : 1;
    return a->mb - b->mb;
}

/* A loop plan's table, frames and pieces (runtime/pieces.c): every piece
 * of a stage's table runs once per microbatch; every instruction is in the
 * prologue (0), the epilogue (-1) or a piece of its stage's table, runs for
 * every microbatch only in a piece, and a microbatch_sum's add takes two
 * tensors of one size; tags stay within the backends' [0, 32767]. */
static int check_loop(const Plan *p, char *err, size_t n)
{
    int k = p->microbatches, ns = plan_stages(p);
    if (p->nsched < 0 || (p->nsched > 0 && !p->sched) || p->nframes < 0 ||
        (p->nframes > 0 && !p->frames))
        return plan_errorf(err, n, "sched, frames: bad count");
    if (!p->nsched) {
        if (p->nframes)
            return plan_errorf(err, n, "frames: a plan without a schedule table has no frames");
        for (int i = 0; i < p->ninstrs; i++)
            if (p->instrs[i].piece || p->instrs[i].when || p->instrs[i].acc || p->instrs[i].rows)
                return plan_errorf(err, n, "instrs[%d]: piece, when, acc and rows belong to a "
                                           "plan with a schedule table", i);
        return 0;
    }
    if (k < 2 || p->nsched % k || p->ntags < 0 || p->ntags > 32768)
        return plan_errorf(err, n, "microbatches: %d with %d table entries and %d tags per "
                                   "microbatch (at most 32768)",
                           k, p->nsched, p->ntags);
    PlanSched *sorted = malloc(sizeof(PlanSched) * (size_t)p->nsched);
    if (!sorted)
        return plan_errorf(err, n, "out of memory");
    for (int e = 0; e < p->nsched; e++) {
        const PlanSched *t = &p->sched[e];
        sorted[e] = *t;
        if (t->stage < 0 || t->stage >= ns || t->piece < 1 || t->mb < 0 || t->mb >= k) {
            free(sorted);
            return plan_errorf(err, n, "sched[%d]: stage %d, piece %d, microbatch %d out of range",
                               e, t->stage, t->piece, t->mb);
        }
    }
    qsort(sorted, (size_t)p->nsched, sizeof(PlanSched), by_sched);
    for (int e = 0; e < p->nsched; e++) { /* each (stage, piece) runs for microbatches 0..k-1 */
        const PlanSched *t = &sorted[e], *g = &sorted[e - e % k];
        if (t->stage != g->stage || t->piece != g->piece || t->mb != e % k) {
            int stage = t->stage, piece = t->piece;
            free(sorted);
            return plan_errorf(err, n, "sched: piece %d of stage %d does not run once for each of "
                                       "the %d microbatches",
                               piece, stage, k);
        }
    }
    for (int f = 0; f < p->nframes; f++) {
        const PlanFrame *fr = &p->frames[f];
        if (fr->stage < 0 || fr->stage >= ns || !fr->base || fr->bytes % PLAN_ALIGN)
            return free(sorted), plan_errorf(err, n, "frames[%d]: bad stage, bytes or bases", f);
        uint64_t slab = plan_stage_slab(p, fr->stage);
        for (int j = 0; j < k; j++)
            if (fr->base[j] % PLAN_ALIGN || fr->base[j] > slab || fr->bytes > slab - fr->base[j])
                return free(sorted), plan_errorf(err, n, "frames[%d].base[%d]: %" PRIu64 " bytes from %" PRIu64
                                           " lie outside the slab of stage %d",
                                   f, j, fr->bytes, fr->base[j], fr->stage);
    }
    for (int i = 0; i < p->ninstrs; i++) {
        const PlanInstr *in = &p->instrs[i];
        PlanSched key = {in->stage, in->piece, 0};
        int found = in->piece == 0 || in->piece == -1 ||
                    bsearch(&key, sorted, (size_t)p->nsched, sizeof(PlanSched), by_sched);
        const char *bad = NULL;
        if (!found || (unsigned)in->when >= PW_COUNT ||
            (in->when == PW_EVERY && (in->piece == 0 || in->piece == -1)))
            bad = "piece, when: not a piece of its stage's table, or a per-microbatch "
                  "instruction outside one";
        else if (in->acc && (in->kind != PI_KERNEL || in->nargs != 2 || in->when != PW_EVERY ||
                             p->tensors[in->args[0]].bytes != p->tensors[in->args[1]].bytes))
            bad = "acc: a microbatch_sum adds one tensor into another of its size, for every "
                  "microbatch";
        else if (in->rows &&
                 (in->kind != PI_COPY || in->when != PW_EVERY ||
                  p->tensors[in->args[1]].role != PT_INPUT ||
                  p->tensors[in->args[1]].bytes != (uint64_t)k * p->tensors[in->args[0]].bytes))
            bad = "rows: a copy of one microbatch's rows of an input, for every microbatch";
        else if (in->kind == PI_COLL && is_p2p(in->coll.op) && in->coll.tag >= p->ntags)
            bad = "tag: beyond the tags of one microbatch (ntags)";
        if (bad) {
            free(sorted);
            return plan_errorf(err, n, "instrs[%d].%s", i, bad);
        }
    }
    free(sorted);
    return 0;
}

int plan_check_struct(const Plan *p, char *err, size_t n)
{
    if (check_counts(p, err, n))
        return -1;
    if (p->microbatches < 0)
        return plan_errorf(err, n, "microbatches: %d is negative", p->microbatches);
    for (int i = 0; i < p->ntensors; i++)
        if (check_tensor_shape(p, i, err, n) || check_tensor_role(p, i, err, n) ||
            check_tensor_split(p, i, err, n))
            return -1;
    if (check_kernels(p, err, n) || check_names(p, err, n))
        return -1;
    for (int i = 0; i < p->ninstrs; i++)
        if (check_instr(p, i, err, n))
            return -1;
    for (int i = 0; plan_stages(p) > 1 && i < p->ninstrs; i++)
        if (check_instr_stage(p, i, err, n))
            return -1;
    if (check_output(p, "loss", p->loss, err, n) || check_output(p, "lr", p->lr, err, n) ||
        check_output(p, "grad_norm", p->grad_norm, err, n) || check_loop(p, err, n))
        return -1;
    return 0;
}

int plan_check(const Plan *p, char *err, size_t n)
{
    if (plan_check_struct(p, err, n))
        return -1;
    if (p->nsched > 0) /* one microbatch's pieces: plan_expand checks the program they make */
        return 0;
    return plan_check_comm(p, NULL, err, n);
}

/* ---- plan_write ---- */

typedef struct Wr {
    char *err;
    size_t n;
    int failed;
} Wr;

static void wr_fail(Wr *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wr_fail(Wr *w, const char *fmt, ...)
{
    va_list ap;
    if (w->failed++ || !w->err || !w->n)
        return;
    va_start(ap, fmt);
    vsnprintf(w->err, w->n, fmt, ap);
    va_end(ap);
}

/* cJSON returns NULL when out of memory; one check per added item. */
static cJSON *wr_add(Wr *w, cJSON *o, const char *key, cJSON *item)
{
    if (!item || !o) {
        cJSON_Delete(item);
        wr_fail(w, "cJSON: out of memory");
        return NULL;
    }
    if (!cJSON_IsArray(o))
        cJSON_AddItemToObject(o, key, item);
    else
        cJSON_AddItemToArray(o, item);
    return item;
}

/* Numbers are written by hand: cJSON's own printing may drop the last digit of
 * a double (it accepts a 15-digit form within an epsilon), and the hash needs
 * every bit back. */
static void wr_int(Wr *w, cJSON *o, const char *at, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    if (v > JSON_EXACT || v < -JSON_EXACT)
        wr_fail(w, "%s%s%s: %" PRId64 " is beyond 2^53, which JSON numbers do not hold exactly", at,
                *at ? "." : "", key, v);
    else
        wr_add(w, o, key, cJSON_CreateRaw(buf));
}

static void wr_u64(Wr *w, cJSON *o, const char *at, const char *key, uint64_t v)
{
    if (v > (uint64_t)JSON_EXACT)
        wr_fail(w, "%s%s%s: %" PRIu64 " is beyond 2^53, which JSON numbers do not hold exactly", at,
                *at ? "." : "", key, v);
    else
        wr_int(w, o, at, key, (int64_t)v);
}

static void wr_num(Wr *w, cJSON *o, const char *at, const char *key, double v)
{
    char buf[40];
    if (!isfinite(v)) {
        wr_fail(w, "%s%s%s: %g is not finite", at, *at ? "." : "", key, v);
        return;
    }
    for (int digits = 15; digits <= 17; digits++) { /* the shortest that reads back exactly */
        snprintf(buf, sizeof buf, "%.*g", digits, v == 0 ? 0 : v);
        if (strtod(buf, NULL) == v)
            break;
    }
    wr_add(w, o, key, cJSON_CreateRaw(buf));
}

static void wr_str(Wr *w, cJSON *o, const char *key, const char *s)
{
    wr_add(w, o, key, cJSON_CreateString(str_or_empty(s)));
}

static const char *wr_name(Wr *w, const char *at, const char *what, const char *const *names,
                           int count, int v)
{
    if (v >= 0 && v < count)
        return names[v];
    wr_fail(w, "%s.%s: %d is out of range", at, what, v);
    return "?";
}

static void wr_tensor(Wr *w, cJSON *arr, int i, const PlanTensor *t)
{
    char at[48];
    snprintf(at, sizeof at, "tensors[%d]", i);
    cJSON *o = wr_add(w, arr, NULL, cJSON_CreateObject());
    wr_str(w, o, "name", t->name);
    wr_str(w, o, "dtype", wr_name(w, at, "dtype", dtype_names, PD_COUNT, t->dtype));
    cJSON *shape = wr_add(w, o, "shape", cJSON_CreateArray());
    if (t->rank < 0 || t->rank > PLAN_MAX_RANK)
        wr_fail(w, "%s.rank: %d is outside [0, %d]", at, t->rank, PLAN_MAX_RANK);
    for (int d = 0; d < t->rank && d < PLAN_MAX_RANK && shape; d++)
        wr_int(w, shape, at, "shape", t->shape[d]);
    wr_u64(w, o, at, "offset", t->offset);
    wr_u64(w, o, at, "bytes", t->bytes);
    wr_str(w, o, "role", wr_name(w, at, "role", role_names, PT_COUNT, t->role));
    wr_str(w, o, "init", t->init);
    wr_num(w, o, at, "init_arg", t->init_arg);
    wr_int(w, o, at, "layer", t->layer);
    wr_int(w, o, at, "limit", t->limit);
    wr_int(w, o, at, "value", t->value);
    cJSON *split = wr_add(w, o, "split", cJSON_CreateArray());
    for (int d = 0; d < t->rank && d < PLAN_MAX_RANK && split; d++) {
        cJSON *axes = wr_add(w, split, NULL, cJSON_CreateArray());
        for (int j = 0; j < t->nsplit[d] && j < PLAN_MAX_AXES && axes; j++)
            wr_int(w, axes, at, "split", t->split[d][j]);
    }
    cJSON *coord = wr_add(w, o, "coord", cJSON_CreateArray());
    for (int j = 0; j < t->ncoord && j < PLAN_MAX_AXES && coord; j++)
        wr_int(w, coord, at, "coord", t->coord[j]);
    if (t->stage != -1) /* one-stage plans look as before */
        wr_int(w, o, at, "stage", t->stage);
    if (t->frame)
        wr_int(w, o, at, "frame", t->frame);
}

static void wr_gemm(Wr *w, cJSON *parent, const char *at, const PlanGemm *g)
{
    cJSON *o = wr_add(w, parent, "gemm", cJSON_CreateObject());
    const char *keys[] = {"a",   "b",   "c",   "trans_a", "trans_b",  "m",        "n",       "k",
                          "lda", "ldb", "ldc", "batch",   "stride_a", "stride_b", "stride_c"};
    int64_t v[] = {g->a,   g->b,   g->c,   g->trans_a, g->trans_b,  g->m,        g->n,       g->k,
                   g->lda, g->ldb, g->ldc, g->batch,   g->stride_a, g->stride_b, g->stride_c};
    for (size_t j = 0; j < sizeof v / sizeof v[0]; j++)
        wr_int(w, o, at, keys[j], v[j]);
    wr_num(w, o, at, "alpha", g->alpha);
    wr_num(w, o, at, "beta", g->beta);
    if (g->epilogue == PE_BIAS)
        wr_int(w, o, at, "bias", g->bias);
}

static void wr_instr(Wr *w, cJSON *arr, int i, const PlanInstr *in)
{
    char at[48];
    snprintf(at, sizeof at, "instrs[%d]", i);
    cJSON *o = wr_add(w, arr, NULL, cJSON_CreateObject());
    wr_str(w, o, "kind", wr_name(w, at, "kind", kind_names, PI_COUNT, in->kind));
    if (in->kind == PI_KERNEL)
        wr_int(w, o, at, "kernel", in->kernel);
    cJSON *args = wr_add(w, o, "args", cJSON_CreateArray());
    if (in->nargs < 0 || (in->nargs > 0 && !in->args))
        wr_fail(w, "%s.args: %d arguments but no array", at, in->nargs);
    for (int j = 0; j < in->nargs && in->args && args; j++)
        wr_int(w, args, at, "args", in->args[j]);
    if (in->kind == PI_GEMM)
        wr_gemm(w, o, at, &in->gemm);
    if (in->kind == PI_COLL) {
        const PlanColl *c = &in->coll;
        wr_str(w, o, "op", wr_name(w, at, "op", coll_names, PC_COUNT, c->op));
        cJSON *axes = wr_add(w, o, "axes", cJSON_CreateArray());
        for (int j = 0; j < c->naxes && j < PLAN_MAX_AXES && axes; j++)
            wr_int(w, axes, at, "axes", c->axes[j]);
        wr_int(w, o, at, "dim", c->dim);
        wr_int(w, o, at, "dim2", c->dim2);
        wr_int(w, o, at, "bytes", c->bytes);
        if (is_p2p(c->op)) {
            wr_int(w, o, at, "peer", c->peer);
            wr_int(w, o, at, "tag", c->tag);
        }
    }
    wr_int(w, o, at, "phase", in->phase);
    wr_int(w, o, at, "layer", in->layer);
    if (in->stage != 0)
        wr_int(w, o, at, "stage", in->stage);
    if (in->piece)
        wr_int(w, o, at, "piece", in->piece);
    if (in->when)
        wr_int(w, o, at, "when", in->when);
    if (in->acc)
        wr_int(w, o, at, "acc", in->acc);
    if (in->group)
        wr_int(w, o, at, "group", in->group);
    if (in->rows)
        wr_int(w, o, at, "rows", in->rows);
}

/* The microbatch loop: written when the plan has a schedule table. */
static void wr_loop(Wr *w, cJSON *root, const Plan *p)
{
    if (p->nsched <= 0)
        return;
    wr_int(w, root, "", "microbatches", p->microbatches);
    wr_int(w, root, "", "ntags", p->ntags);
    cJSON *sched = wr_add(w, root, "sched", cJSON_CreateArray());
    for (int i = 0; i < p->nsched && p->sched && sched; i++) {
        wr_int(w, sched, "sched", "stage", p->sched[i].stage);
        wr_int(w, sched, "sched", "piece", p->sched[i].piece);
        wr_int(w, sched, "sched", "mb", p->sched[i].mb);
    }
    cJSON *frames = wr_add(w, root, "frames", cJSON_CreateArray());
    for (int f = 0; f < p->nframes && p->frames && frames; f++) {
        char at[48];
        snprintf(at, sizeof at, "frames[%d]", f);
        cJSON *o = wr_add(w, frames, NULL, cJSON_CreateObject());
        wr_int(w, o, at, "stage", p->frames[f].stage);
        wr_u64(w, o, at, "bytes", p->frames[f].bytes);
        cJSON *base = wr_add(w, o, "base", cJSON_CreateArray());
        for (int j = 0; j < p->microbatches && p->frames[f].base && base; j++)
            wr_u64(w, base, at, "base", p->frames[f].base[j]);
    }
}

static void wr_lists(Wr *w, cJSON *root, const Plan *p)
{
    cJSON *axes = wr_add(w, root, "axes", cJSON_CreateArray());
    char at[48];
    for (int i = 0; i < p->naxes && p->axes && axes; i++) {
        cJSON *o = wr_add(w, axes, NULL, cJSON_CreateObject());
        snprintf(at, sizeof at, "axes[%d]", i);
        wr_str(w, o, "name", p->axes[i].name);
        wr_str(w, o, "role", p->axes[i].role);
        wr_int(w, o, at, "size", p->axes[i].size);
    }
    wr_u64(w, root, "", "slab_bytes", p->slab_bytes);
    cJSON *slabs = wr_add(w, root, "stage_slab_bytes", cJSON_CreateArray());
    for (int s = 0; s < plan_stages(p) && slabs; s++) {
        char buf[32];
        snprintf(buf, sizeof buf, "%" PRIu64, plan_stage_slab(p, s));
        if (plan_stage_slab(p, s) > (uint64_t)JSON_EXACT)
            wr_fail(w, "stage_slab_bytes[%d]: beyond 2^53, which JSON numbers do not hold", s);
        else
            wr_add(w, slabs, NULL, cJSON_CreateRaw(buf));
    }
    cJSON *tensors = wr_add(w, root, "tensors", cJSON_CreateArray());
    for (int i = 0; i < p->ntensors && p->tensors && tensors; i++)
        wr_tensor(w, tensors, i, &p->tensors[i]);
    cJSON *kernels = wr_add(w, root, "kernels", cJSON_CreateArray());
    for (int i = 0; i < p->nkernels && p->kernels && kernels; i++) {
        cJSON *o = wr_add(w, kernels, NULL, cJSON_CreateObject());
        snprintf(at, sizeof at, "kernels[%d]", i);
        wr_str(w, o, "name", p->kernels[i].name);
        wr_int(w, o, at, "nargs", p->kernels[i].nargs);
        wr_int(w, o, at, "pattern", p->kernels[i].pattern);
        wr_int(w, o, at, "grid", p->kernels[i].grid);
        wr_int(w, o, at, "block", p->kernels[i].block);
    }
    cJSON *instrs = wr_add(w, root, "instrs", cJSON_CreateArray());
    for (int i = 0; i < p->ninstrs && p->instrs && instrs; i++)
        wr_instr(w, instrs, i, &p->instrs[i]);
    if ((p->naxes && !p->axes) || (p->ntensors && !p->tensors) || (p->nkernels && !p->kernels) ||
        (p->ninstrs && !p->instrs) || p->naxes < 0 || p->ntensors < 0 || p->nkernels < 0 ||
        p->ninstrs < 0)
        wr_fail(w, "a count of axes, tensors, kernels or instrs does not match its array");
}

static cJSON *wr_plan(Wr *w, const Plan *p)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) {
        wr_fail(w, "cJSON: out of memory");
        return NULL;
    }
    wr_str(w, root, "format", PLAN_FORMAT);
    wr_int(w, root, "", "version", p->version);
    wr_str(w, root, "hash", p->hash);
    wr_str(w, root, "model", p->model);
    wr_str(w, root, "train_hash", p->train_hash);
    wr_lists(w, root, p);
    wr_int(w, root, "", "loss", p->loss);
    wr_int(w, root, "", "lr", p->lr);
    wr_int(w, root, "", "grad_norm", p->grad_norm);
    wr_num(w, root, "", "flops", p->flops);
    wr_int(w, root, "", "steps", p->steps);
    wr_int(w, root, "", "seed", p->seed);
    wr_loop(w, root, p);
    wr_str(w, root, "kernel_source", p->kernel_source);
    wr_str(w, root, "gpu_source", p->gpu_source ? p->gpu_source : "");
    return root;
}

static int write_file(const char *path, const char *text, char *err, size_t n)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return plan_errorf(err, n, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return plan_errorf(err, n, "fopen %s: %s", tmp, strerror(errno));
    size_t len = strlen(text);
    int ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    const char *call = !ok ? "fwrite" : fflush(f) ? "fflush" : fsync(fileno(f)) ? "fsync" : NULL;
    int e = errno;
    if (fclose(f) && !call) {
        call = "fclose";
        e = errno;
    }
    if (!call && rename(tmp, path)) {
        call = "rename";
        e = errno;
    }
    if (call) {
        unlink(tmp);
        return plan_errorf(err, n, "%s %s: %s", call, tmp, strerror(e));
    }
    return 0;
}

char *plan_to_json(Plan *p, char *err, size_t errlen)
{
    Wr w = {err, errlen, 0};
    p->version = PLAN_VERSION;
    plan_hash(p, p->hash);
    cJSON *root = wr_plan(&w, p);
    char *text = w.failed ? NULL : cJSON_Print(root);
    if (!w.failed && !text)
        wr_fail(&w, "cJSON_Print: out of memory");
    cJSON_Delete(root);
    return w.failed ? NULL : text;
}

int plan_write(const char *path, Plan *p, char *err, size_t errlen)
{
    char *text = plan_to_json(p, err, errlen);
    if (!text) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", err && errlen ? err : "");
        return plan_errorf(err, errlen, "%s: cannot write the plan: %s", path, msg);
    }
    int rc = write_file(path, text, err, errlen);
    free(text);
    return rc;
}

/* ---- plan_load: JSON -> Plan, checking types and names ---- */

/* "at.key", or "key" at the top level. */
static const char *field(char *buf, size_t n, const char *at, const char *key)
{
    snprintf(buf, n, "%s%s%s", at, *at && key ? "." : "", key ? key : "");
    return buf;
}

/* o must be an object whose keys are all in allowed (NULL-terminated), each once. */
static int rd_keys(const cJSON *o, const char *at, const char *const *allowed, char *err, size_t n)
{
    char q[SHOWN];
    if (!cJSON_IsObject(o))
        return plan_errorf(err, n, "%s: expected an object", *at ? at : "plan");
    for (const cJSON *c = o->child; c; c = c->next) {
        int known = 0;
        if (!c->string)
            return plan_errorf(err, n, "%s: a field has no name", *at ? at : "plan");
        for (int i = 0; allowed[i] && !known; i++)
            known = !strcmp(c->string, allowed[i]);
        if (!known)
            return plan_errorf(err, n, "%s%sunknown field \"%s\"", at, *at ? ": " : "",
                       shown(q, c->string));
        for (const cJSON *d = o->child; d != c; d = d->next)
            if (!strcmp(c->string, d->string))
                return plan_errorf(err, n, "%s%sfield \"%s\" appears twice", at, *at ? ": " : "",
                           shown(q, c->string));
    }
    return 0;
}

static const cJSON *rd_member(const cJSON *o, const char *at, const char *key, char *err, size_t n)
{
    char f[128];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        plan_errorf(err, n, "%s: missing", field(f, sizeof f, at, key));
    return v;
}

/* A JSON number that is an integer held exactly. */
static int json_int(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= -(double)JSON_EXACT && d <= (double)JSON_EXACT) || d != floor(d))
        return 0;
    *out = (int64_t)d;
    return 1;
}

static int rd_int(const cJSON *o, const char *at, const char *key, int64_t lo, int64_t hi,
                  int64_t *out, char *err, size_t n)
{
    char f[128];
    const cJSON *v = rd_member(o, at, key, err, n);
    if (!v)
        return -1;
    if (!json_int(v, out) || *out < lo || *out > hi)
        return plan_errorf(err, n, "%s: expected an integer in [%" PRId64 ", %" PRId64 "]",
                   field(f, sizeof f, at, key), lo, hi);
    return 0;
}

static int rd_i32(const cJSON *o, const char *at, const char *key, int *out, char *err, size_t n)
{
    int64_t v;
    if (rd_int(o, at, key, INT_MIN, INT_MAX, &v, err, n))
        return -1;
    *out = (int)v;
    return 0;
}

/* An optional integer: def when the key is absent. */
static int rd_opt_i32(const cJSON *o, const char *at, const char *key, int def, int *out,
                      char *err, size_t n)
{
    if (!cJSON_GetObjectItemCaseSensitive(o, key)) {
        *out = def;
        return 0;
    }
    return rd_i32(o, at, key, out, err, n);
}

static int rd_u64(const cJSON *o, const char *at, const char *key, uint64_t *out, char *err,
                  size_t n)
{
    int64_t v;
    if (rd_int(o, at, key, 0, JSON_EXACT, &v, err, n))
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int rd_num(const cJSON *o, const char *at, const char *key, double *out, char *err, size_t n)
{
    char f[128];
    const cJSON *v = rd_member(o, at, key, err, n);
    if (!v)
        return -1;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return plan_errorf(err, n, "%s: expected a finite number", field(f, sizeof f, at, key));
    *out = v->valuedouble;
    return 0;
}

static int rd_str(const cJSON *o, const char *at, const char *key, char **out, char *err, size_t n)
{
    char f[128];
    const cJSON *v = rd_member(o, at, key, err, n);
    if (!v)
        return -1;
    if (!cJSON_IsString(v) || !v->valuestring)
        return plan_errorf(err, n, "%s: expected a string", field(f, sizeof f, at, key));
    if (!(*out = strdup(v->valuestring)))
        return plan_errorf(err, n, "strdup: out of memory");
    return 0;
}

static int rd_enum(const cJSON *o, const char *at, const char *key, const char *const *names,
                   int count, const char *what, int *out, char *err, size_t n)
{
    char f[128], q[SHOWN];
    const cJSON *v = rd_member(o, at, key, err, n);
    if (!v)
        return -1;
    if (!cJSON_IsString(v) || !v->valuestring)
        return plan_errorf(err, n, "%s: expected a string", field(f, sizeof f, at, key));
    for (int i = 0; i < count; i++)
        if (!strcmp(v->valuestring, names[i])) {
            *out = i;
            return 0;
        }
    return plan_errorf(err, n, "%s: unknown %s \"%s\"", field(f, sizeof f, at, key), what,
               shown(q, v->valuestring));
}

/* An array of integers in [lo, hi], at most max long: a calloc'd copy in *out. */
static int rd_ints(const cJSON *o, const char *at, const char *key, int max, int64_t lo, int64_t hi,
                   int64_t **out, int *count, char *err, size_t n)
{
    char f[128];
    const cJSON *v = rd_member(o, at, key, err, n);
    if (!v)
        return -1;
    int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1, i = 0;
    if (len < 0 || len > max || !(*out = calloc((size_t)len + 1, sizeof(int64_t))))
        goto fail;
    for (const cJSON *c = v->child; c; c = c->next, i++)
        if (!json_int(c, &(*out)[i]) || (*out)[i] < lo || (*out)[i] > hi)
            goto fail;
    *count = len;
    return 0;
fail:
    free(*out);
    *out = NULL;
    if (max < INT_MAX)
        return plan_errorf(err, n, "%s: expected an array of at most %d integers",
                   field(f, sizeof f, at, key), max);
    return plan_errorf(err, n, "%s: expected an array of integers in [%" PRId64 ", %" PRId64 "]",
               field(f, sizeof f, at, key), lo, hi);
}

/* An array member: its element count, or -1. */
static int rd_array(const cJSON *o, const char *key, const cJSON **arr, char *err, size_t n)
{
    *arr = rd_member(o, "", key, err, n);
    if (!*arr)
        return -1;
    if (!cJSON_IsArray(*arr))
        return plan_errorf(err, n, "%s: expected an array", key);
    return cJSON_GetArraySize(*arr);
}

/* Axis indices (at most PLAN_MAX_AXES, each in [0, 127]) into axes, count into *na. */
static int rd_axes(const cJSON *o, const char *at, const char *key, int8_t *axes, int *na,
                   char *err, size_t n)
{
    int64_t *v = NULL;
    if (rd_ints(o, at, key, PLAN_MAX_AXES, 0, 127, &v, na, err, n))
        return -1;
    for (int j = 0; j < *na; j++)
        axes[j] = (int8_t)v[j];
    free(v);
    return 0;
}

/* An array of axis indices, the value v itself. */
static int rd_axes_value(const cJSON *v, const char *at, int8_t *axes, uint8_t *na, char *err,
                         size_t n)
{
    int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1, i = 0;
    int64_t x;
    if (len < 0 || len > PLAN_MAX_AXES)
        return plan_errorf(err, n, "%s: expected an array of at most %d axes", at, PLAN_MAX_AXES);
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        if (!json_int(c, &x) || x < 0 || x > 127)
            return plan_errorf(err, n, "%s: expected axis indices", at);
        axes[i] = (int8_t)x;
    }
    *na = (uint8_t)len;
    return 0;
}

static int rd_split(const cJSON *o, const char *at, PlanTensor *t, char *err, size_t n)
{
    char f[64];
    const cJSON *arr = rd_member(o, at, "split", err, n);
    if (!arr)
        return -1;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != t->rank)
        return plan_errorf(err, n, "%s.split: expected one array per dimension", at);
    for (int d = 0; d < t->rank; d++)
        if (rd_axes_value(cJSON_GetArrayItem(arr, d), field(f, sizeof f, at, "split"),
                          t->split[d], &t->nsplit[d], err, n))
            return -1;
    return rd_axes(o, at, "coord", t->coord, &t->ncoord, err, n);
}

static int rd_tensor(const cJSON *o, const char *at, PlanTensor *t, char *err, size_t n)
{
    static const char *const keys[] = {"name",  "dtype", "shape", "offset", "bytes",
                                       "role",  "init",  "init_arg", "layer", "limit",
                                       "value", "split", "coord", "stage", "frame", NULL};
    int64_t *shape = NULL;
    int dt, role;
    if (rd_keys(o, at, keys, err, n) || rd_str(o, at, "name", &t->name, err, n) ||
        rd_enum(o, at, "dtype", dtype_names, PD_COUNT, "dtype", &dt, err, n) ||
        rd_ints(o, at, "shape", PLAN_MAX_RANK, -JSON_EXACT, JSON_EXACT, &shape, &t->rank, err, n))
        return -1;
    t->dtype = (PlanDType)dt;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)t->rank);
    free(shape);
    if (rd_u64(o, at, "offset", &t->offset, err, n) || rd_u64(o, at, "bytes", &t->bytes, err, n) ||
        rd_enum(o, at, "role", role_names, PT_COUNT, "role", &role, err, n) ||
        rd_str(o, at, "init", &t->init, err, n) ||
        rd_num(o, at, "init_arg", &t->init_arg, err, n) ||
        rd_i32(o, at, "layer", &t->layer, err, n) ||
        rd_int(o, at, "limit", -JSON_EXACT, JSON_EXACT, &t->limit, err, n) ||
        rd_i32(o, at, "value", &t->value, err, n) || rd_split(o, at, t, err, n) ||
        rd_opt_i32(o, at, "stage", -1, &t->stage, err, n) ||
        rd_opt_i32(o, at, "frame", 0, &t->frame, err, n))
        return -1;
    t->role = (PlanRole)role;
    return 0;
}

static int rd_gemm(const cJSON *o, const char *at, PlanGemm *g, char *err, size_t n)
{
    static const char *const keys[] = {
        "a",   "b",   "c",     "trans_a",  "trans_b",  "m",        "n",     "k",    "lda",
        "ldb", "ldc", "batch", "stride_a", "stride_b", "stride_c", "alpha", "beta", "bias", NULL};
    int *ints[] = {&g->a, &g->b, &g->c, &g->trans_a, &g->trans_b};
    int64_t *longs[] = {&g->m,   &g->n,     &g->k,        &g->lda,      &g->ldb,
                        &g->ldc, &g->batch, &g->stride_a, &g->stride_b, &g->stride_c};
    if (rd_keys(o, at, keys, err, n))
        return -1;
    for (int j = 0; j < 5; j++)
        if (rd_i32(o, at, keys[j], ints[j], err, n))
            return -1;
    for (int j = 0; j < 10; j++)
        if (rd_int(o, at, keys[5 + j], -JSON_EXACT, JSON_EXACT, longs[j], err, n))
            return -1;
    if (rd_num(o, at, "alpha", &g->alpha, err, n) || rd_num(o, at, "beta", &g->beta, err, n) ||
        rd_opt_i32(o, at, "bias", -1, &g->bias, err, n))
        return -1;
    g->epilogue = g->bias == -1 ? PE_NONE : PE_BIAS;
    return 0;
}

/* The fields of a collective; peer and tag belong to send and recv only. */
static int rd_coll(const cJSON *o, const char *at, PlanColl *c, char *err, size_t n)
{
    int op;
    if (rd_enum(o, at, "op", coll_names, PC_COUNT, "collective", &op, err, n) ||
        rd_axes(o, at, "axes", c->axes, &c->naxes, err, n) ||
        rd_i32(o, at, "dim", &c->dim, err, n) || rd_i32(o, at, "dim2", &c->dim2, err, n) ||
        rd_int(o, at, "bytes", 0, JSON_EXACT, &c->bytes, err, n))
        return -1;
    c->op = (PlanCollKind)op;
    if (is_p2p(c->op)) {
        if (rd_i32(o, at, "peer", &c->peer, err, n) || rd_i32(o, at, "tag", &c->tag, err, n))
            return -1;
        return 0;
    }
    for (int j = 0; j < 2; j++)
        if (cJSON_GetObjectItemCaseSensitive(o, j ? "tag" : "peer"))
            return plan_errorf(err, n, "%s: unknown field \"%s\" (only send and recv have it)", at,
                               j ? "tag" : "peer");
    return 0;
}

static int rd_instr(const cJSON *o, const char *at, PlanInstr *in, char *err, size_t n)
{
    static const char *const keys[PI_COUNT][16] = {
        {"kind", "kernel", "args", "phase", "layer", "stage", "piece", "when", "acc", "group", NULL},
        {"kind", "args", "gemm", "phase", "layer", "stage", "piece", "when", NULL},
        {"kind", "args", "phase", "layer", "stage", "piece", "when", "rows", NULL},
        {"kind", "op", "args", "axes", "dim", "dim2", "bytes", "peer", "tag", "phase", "layer",
         "stage", "piece", "when", NULL},
    };
    int kind;
    int64_t *args = NULL;
    char f[64];
    if (!cJSON_IsObject(o))
        return plan_errorf(err, n, "%s: expected an object", at);
    if (rd_enum(o, at, "kind", kind_names, PI_COUNT, "instruction kind", &kind, err, n) ||
        rd_keys(o, at, keys[kind], err, n))
        return -1;
    in->kind = (PlanInstrKind)kind;
    if ((kind == PI_KERNEL && rd_i32(o, at, "kernel", &in->kernel, err, n)) ||
        rd_ints(o, at, "args", INT_MAX, INT_MIN, INT_MAX, &args, &in->nargs, err, n))
        return -1;
    in->args = calloc((size_t)in->nargs + 1, sizeof(int));
    for (int j = 0; in->args && j < in->nargs; j++)
        in->args[j] = (int)args[j];
    free(args);
    if (!in->args)
        return plan_errorf(err, n, "calloc: out of memory");
    const cJSON *g = kind == PI_GEMM ? rd_member(o, at, "gemm", err, n) : NULL;
    if (kind == PI_GEMM && (!g || rd_gemm(g, field(f, sizeof f, at, "gemm"), &in->gemm, err, n)))
        return -1;
    if (kind == PI_COLL && rd_coll(o, at, &in->coll, err, n))
        return -1;
    int when = 0;
    if (rd_i32(o, at, "phase", &in->phase, err, n) || rd_i32(o, at, "layer", &in->layer, err, n) ||
        rd_opt_i32(o, at, "stage", 0, &in->stage, err, n) ||
        rd_opt_i32(o, at, "piece", 0, &in->piece, err, n) ||
        rd_opt_i32(o, at, "when", 0, &when, err, n) ||
        (kind == PI_KERNEL && rd_opt_i32(o, at, "acc", 0, &in->acc, err, n)) ||
        (kind == PI_KERNEL && rd_opt_i32(o, at, "group", 0, &in->group, err, n)) ||
        (kind == PI_COPY && rd_opt_i32(o, at, "rows", 0, &in->rows, err, n)))
        return -1;
    in->when = (PlanWhen)when;
    return 0;
}

/* Each element of the array member key, read by one of the functions below. */
/* The calloc'd array (NULL on failure, or with *rc = -1 when an element is bad:
 * the caller keeps it, with *count set, so plan_free releases what was read). */
static void *rd_each(const cJSON *root, const char *key, size_t size, int *count,
                     int (*one)(const cJSON *, const char *, void *, char *, size_t), int *rc,
                     char *err, size_t n)
{
    const cJSON *arr;
    char at[48];
    int len = rd_array(root, key, &arr, err, n), i = 0;
    char *items = len < 0 ? NULL : calloc((size_t)len + 1, size);
    *rc = -1;
    if (len >= 0 && !items)
        plan_errorf(err, n, "calloc: out of memory");
    if (!items)
        return NULL;
    *count = len;
    for (const cJSON *c = arr->child; c; c = c->next, i++) {
        snprintf(at, sizeof at, "%s[%d]", key, i);
        if (one(c, at, items + size * (size_t)i, err, n))
            return items;
    }
    *rc = 0;
    return items;
}

static int rd_axis_one(const cJSON *o, const char *at, void *item, char *err, size_t n)
{
    static const char *const keys[] = {"name", "role", "size", NULL};
    PlanAxis *a = item;
    if (rd_keys(o, at, keys, err, n) || rd_str(o, at, "name", &a->name, err, n) ||
        rd_str(o, at, "role", &a->role, err, n) || rd_i32(o, at, "size", &a->size, err, n))
        return -1;
    return 0;
}

static int rd_kernel_one(const cJSON *o, const char *at, void *item, char *err, size_t n)
{
    static const char *const keys[] = {"name", "nargs", "pattern", "grid", "block", NULL};
    PlanKernel *k = item;
    if (rd_keys(o, at, keys, err, n) || rd_str(o, at, "name", &k->name, err, n) ||
        rd_i32(o, at, "nargs", &k->nargs, err, n) || rd_i32(o, at, "pattern", &k->pattern, err, n) ||
        rd_int(o, at, "grid", 0, JSON_EXACT, &k->grid, err, n) ||
        rd_i32(o, at, "block", &k->block, err, n))
        return -1;
    return 0;
}

static int rd_tensor_one(const cJSON *o, const char *at, void *item, char *err, size_t n)
{
    return rd_tensor(o, at, item, err, n);
}

static int rd_instr_one(const cJSON *o, const char *at, void *item, char *err, size_t n)
{
    return rd_instr(o, at, item, err, n);
}

/* The microbatch loop (wr_loop): absent in a plan without one. */
static int rd_loop(const cJSON *root, Plan *p, char *err, size_t n)
{
    p->microbatches = 1;
    if (!cJSON_GetObjectItemCaseSensitive(root, "sched"))
        return 0;
    int64_t k, tags, *v = NULL;
    int len = 0;
    if (rd_int(root, "", "microbatches", 2, 1 << 20, &k, err, n) ||
        rd_int(root, "", "ntags", 0, 32768, &tags, err, n) ||
        rd_ints(root, "", "sched", INT_MAX, INT_MIN, INT_MAX, &v, &len, err, n))
        return -1;
    p->microbatches = (int)k, p->ntags = (int)tags;
    if (len % 3 || !(p->sched = calloc((size_t)len / 3 + 1, sizeof(PlanSched)))) {
        free(v);
        return plan_errorf(err, n, "sched: expected (stage, piece, microbatch) triples");
    }
    p->nsched = len / 3;
    for (int i = 0; i < p->nsched; i++)
        p->sched[i] = (PlanSched){(int)v[3 * i], (int)v[3 * i + 1], (int)v[3 * i + 2]};
    free(v);
    const cJSON *arr;
    int nf = rd_array(root, "frames", &arr, err, n), f = 0;
    if (nf < 0 || !(p->frames = calloc((size_t)nf + 1, sizeof(PlanFrame))))
        return nf < 0 ? -1 : plan_errorf(err, n, "calloc: out of memory");
    p->nframes = nf;
    for (const cJSON *c = arr->child; c; c = c->next, f++) {
        static const char *const keys[] = {"stage", "bytes", "base", NULL};
        char at[48];
        int64_t *base = NULL;
        int nb = 0;
        snprintf(at, sizeof at, "frames[%d]", f);
        if (!cJSON_IsObject(c) || rd_keys(c, at, keys, err, n) ||
            rd_i32(c, at, "stage", &p->frames[f].stage, err, n) ||
            rd_u64(c, at, "bytes", &p->frames[f].bytes, err, n) ||
            rd_ints(c, at, "base", p->microbatches, 0, JSON_EXACT, &base, &nb, err, n))
            return cJSON_IsObject(c) ? -1 : plan_errorf(err, n, "%s: expected an object", at);
        p->frames[f].base = (uint64_t *)base;
        if (nb != p->microbatches)
            return plan_errorf(err, n, "%s.base: %d bases for %d microbatches", at, nb,
                               p->microbatches);
    }
    return 0;
}

/* "format" and "version" first: a foreign or newer file is named as such. */
static int rd_header(const cJSON *root, Plan *p, char *hash, char *err, size_t n)
{
    char q[SHOWN];
    if (!cJSON_IsObject(root))
        return plan_errorf(err, n, "not a tcc plan: the top level is not a JSON object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!fmt)
        return plan_errorf(err, n, "not a tcc plan: \"format\" is missing, expected \"%s\"", PLAN_FORMAT);
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, PLAN_FORMAT))
        return plan_errorf(err, n, "not a tcc plan: \"format\" is \"%s\", expected \"%s\"",
                   cJSON_IsString(fmt) ? shown(q, fmt->valuestring) : "(not a string)",
                   PLAN_FORMAT);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    int64_t v;
    if (!ver || !json_int(ver, &v))
        return plan_errorf(err, n, "version: expected an integer");
    if (v != PLAN_VERSION)
        return plan_errorf(err, n,
                   "plan version %" PRId64 " is not supported (this runtime reads version %d)", v,
                   PLAN_VERSION);
    p->version = (int)v;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "hash");
    if (!cJSON_IsString(h) || strlen(h->valuestring) != 16 ||
        strspn(h->valuestring, "0123456789abcdef") != 16)
        return plan_errorf(err, n, "hash: expected a string of 16 lowercase hex digits");
    memcpy(hash, h->valuestring, 17);
    return 0;
}

/* train_hash: "" or 16 lower-case hex digits. */
static int rd_train_hash(const cJSON *root, Plan *p, char *err, size_t n)
{
    const cJSON *h = rd_member(root, "", "train_hash", err, n);
    if (!h)
        return -1;
    if (!cJSON_IsString(h) ||
        (*h->valuestring &&
         (strlen(h->valuestring) != 16 || strspn(h->valuestring, "0123456789abcdef") != 16)))
        return plan_errorf(err, n, "train_hash: expected \"\" or 16 lowercase hex digits");
    memcpy(p->train_hash, h->valuestring, strlen(h->valuestring) + 1);
    return 0;
}

/* stage_slab_bytes: one size per pipeline stage (the axes are read). */
static int rd_stage_slabs(const cJSON *root, Plan *p, char *err, size_t n)
{
    int64_t *slabs = NULL;
    int count = 0, stages = plan_stages(p);
    if (rd_ints(root, "", "stage_slab_bytes", stages, 0, JSON_EXACT, &slabs, &count, err, n))
        return -1;
    p->stage_slab_bytes = (uint64_t *)slabs;
    if (count != stages)
        return plan_errorf(err, n, "stage_slab_bytes: %d sizes for %d pipeline stages", count,
                           stages);
    return 0;
}

/* steps and seed, the train block's: absent in plans written before them
 * (then 0 and -1, not set). */
static int rd_defaults(const cJSON *root, Plan *p, char *err, size_t n)
{
    p->steps = 0, p->seed = -1;
    if (cJSON_GetObjectItemCaseSensitive(root, "steps") &&
        rd_int(root, "", "steps", 0, INT32_MAX, &p->steps, err, n))
        return -1;
    if (cJSON_GetObjectItemCaseSensitive(root, "seed") &&
        rd_int(root, "", "seed", -1, JSON_EXACT, &p->seed, err, n))
        return -1;
    return 0;
}

static int rd_plan(const cJSON *root, Plan *p, char *hash, char *err, size_t n)
{
    static const char *const keys[] = {
        "format",     "version",          "hash",    "model",         "train_hash", "axes",
        "slab_bytes", "stage_slab_bytes", "tensors", "kernels",       "instrs",     "loss",
        "lr",         "grad_norm",        "flops",   "kernel_source", "gpu_source", "steps",
        "seed",       "microbatches", "ntags", "sched", "frames", NULL};
    int rc;
    if (rd_header(root, p, hash, err, n) || rd_keys(root, "", keys, err, n) ||
        rd_str(root, "", "model", &p->model, err, n) ||
        rd_u64(root, "", "slab_bytes", &p->slab_bytes, err, n))
        return -1;
    p->axes = rd_each(root, "axes", sizeof(PlanAxis), &p->naxes, rd_axis_one, &rc, err, n);
    if (rc || rd_train_hash(root, p, err, n) || rd_stage_slabs(root, p, err, n))
        return -1;
    p->tensors =
        rd_each(root, "tensors", sizeof(PlanTensor), &p->ntensors, rd_tensor_one, &rc, err, n);
    if (rc)
        return -1;
    p->kernels =
        rd_each(root, "kernels", sizeof(PlanKernel), &p->nkernels, rd_kernel_one, &rc, err, n);
    if (rc)
        return -1;
    p->instrs = rd_each(root, "instrs", sizeof(PlanInstr), &p->ninstrs, rd_instr_one, &rc, err, n);
    if (rc)
        return -1;
    if (rd_i32(root, "", "loss", &p->loss, err, n) || rd_i32(root, "", "lr", &p->lr, err, n) ||
        rd_i32(root, "", "grad_norm", &p->grad_norm, err, n) ||
        rd_num(root, "", "flops", &p->flops, err, n) || rd_defaults(root, p, err, n) ||
        rd_str(root, "", "kernel_source", &p->kernel_source, err, n) ||
        rd_str(root, "", "gpu_source", &p->gpu_source, err, n) || rd_loop(root, p, err, n))
        return -1;
    return 0;
}

/* ---- reading the file ---- */

static char *read_all(const char *path, size_t *len, char *err, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        plan_errorf(err, n, "fopen: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, used = 0;
    char *buf = malloc(cap);
    while (buf) {
        used += fread(buf + used, 1, cap - used, f);
        if (used < cap || cap >= MAX_FILE_BYTES)
            break;
        char *more = realloc(buf, cap *= 2);
        if (!more)
            free(buf);
        buf = more;
    }
    int rerr = ferror(f), e = errno, full = buf && used == cap;
    fclose(f);
    if (!buf || rerr || full) {
        free(buf);
        if (rerr)
            plan_errorf(err, n, "fread: %s", strerror(e));
        else
            plan_errorf(err, n, "%s", !buf ? "out of memory" : "larger than 2 GiB");
        return NULL;
    }
    *len = used;
    return buf;
}

/* Did the text stop early: inside a string, an object or an array, or before
 * any value, with the parser failing in the last token (not somewhere before)? */
static int truncated(const char *s, size_t len, size_t pos)
{
    int depth = 0, in_str = 0, any = 0;
    size_t tail = 0; /* where the last token starts */
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = any = 1;
            tail = i;
        } else if (c && strchr(" \t\r\n,:[]{}", c)) {
            tail = i + 1;
            depth += (c == '{' || c == '[') - (c == '}' || c == ']');
            any |= !strchr(" \t\r\n", c);
        } else {
            any = 1;
        }
    }
    if (!any)
        return 1;
    return (in_str || depth > 0) && pos + 1 >= (tail < len ? tail + 1 : len);
}

static void line_col(const char *s, size_t pos, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static cJSON *parse_json(const char *text, size_t len, char *err, size_t n)
{
    const char *end = NULL;
    int line, col;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t pos = end && end >= text && end <= text + len ? (size_t)(end - text) : len;
    if (!root) {
        if (truncated(text, len, pos)) {
            plan_errorf(err, n, "unexpected end of file (the plan is truncated)");
        } else {
            line_col(text, pos, &line, &col);
            plan_errorf(err, n, "not valid JSON (line %d, column %d)", line, col);
        }
        return NULL;
    }
    while (pos < len && text[pos] && strchr(" \t\r\n", text[pos]))
        pos++;
    if (pos < len) {
        line_col(text, pos, &line, &col);
        cJSON_Delete(root);
        plan_errorf(err, n, "unexpected data after the plan (line %d, column %d)", line, col);
        return NULL;
    }
    return root;
}

Plan *plan_parse(const char *name, const char *text, size_t len, char *err, size_t errlen)
{
    char msg[768] = "", hash[17] = "", got[17];
    Plan *p = NULL;
    cJSON *root = text ? parse_json(text, len, msg, sizeof msg) : NULL;
    if (root && !(p = calloc(1, sizeof *p)))
        plan_errorf(msg, sizeof msg, "calloc: out of memory");
    if (p && (rd_plan(root, p, hash, msg, sizeof msg) || plan_check(p, msg, sizeof msg))) {
        plan_free(p);
        p = NULL;
    }
    cJSON_Delete(root);
    if (p) {
        plan_hash(p, got);
        if (strcmp(got, hash)) {
            plan_free(p);
            p = NULL;
            plan_errorf(msg, sizeof msg, "hash mismatch: the plan was modified or corrupted");
        } else {
            memcpy(p->hash, hash, sizeof hash);
            if (plan_expand(p, 1, NULL, msg, sizeof msg)) { /* the loop, as the executors run it */
                plan_free(p);
                p = NULL;
            }
        }
    }
    if (!p) {
        plan_errorf(err, errlen, "%s: %s", name, msg);
        for (char *c = err; err && errlen && *c; c++) /* one line, whatever the name holds */
            if ((unsigned char)*c < 0x20)
                *c = '?';
    }
    return p;
}

Plan *plan_load(const char *path, char *err, size_t errlen)
{
    char msg[768] = "";
    size_t len = 0;
    char *text = read_all(path, &len, msg, sizeof msg);
    if (!text) {
        plan_errorf(err, errlen, "%s: %s", path, msg);
        for (char *c = err; err && errlen && *c; c++)
            if ((unsigned char)*c < 0x20)
                *c = '?';
        return NULL;
    }
    Plan *p = plan_parse(path, text, len, err, errlen);
    free(text);
    return p;
}

void plan_free(Plan *p)
{
    if (!p)
        return;
    for (int i = 0; p->axes && i < p->naxes; i++) {
        free(p->axes[i].name);
        free(p->axes[i].role);
    }
    for (int i = 0; p->tensors && i < p->ntensors; i++) {
        free(p->tensors[i].name);
        free(p->tensors[i].init);
    }
    for (int i = 0; p->instrs && i < p->ninstrs; i++)
        free(p->instrs[i].args);
    for (int i = 0; p->kernels && i < p->nkernels; i++)
        free(p->kernels[i].name);
    for (int f = 0; p->frames && f < p->nframes; f++)
        free(p->frames[f].base);
    free(p->frames);
    free(p->sched);
    free(p->axes);
    free(p->stage_slab_bytes);
    free(p->tensors);
    free(p->instrs);
    free(p->kernels);
    free(p->model);
    free(p->kernel_source);
    free(p->gpu_source);
    free(p);
}
