/* hash.c: the content hash of a plan (plan_hash): FNV-1a 64 over a
 * canonical serialisation of the Plan struct (docs/plan.md), as 16 hex digits.
 * Reads: a Plan in memory. Writes: the digits into the caller's buffer.
 * Key idea: the hash is taken over the struct, not over the JSON text, in a
 * fixed form: every integer 8 bytes little-endian, a double its IEEE-754 bits
 * (-0 as +0), a string its length then its bytes (NULL as ""), and of an
 * instruction only the fields its kind uses. plan_to_json hashes the plan it
 * writes and plan_parse the plan it read, so spacing, key order or a number's
 * spelling never change a hash, and any edit of a value does. Depends on libc
 * only. */
#include "plan/plan_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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
    size_t n = strlen(plan_str_or_empty(s));
    fnv_u64(f, n);
    fnv_bytes(f, plan_str_or_empty(s), n);
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
        if (plan_is_p2p(c->op)) {
            fnv_i64(f, c->peer);
            fnv_i64(f, c->tag);
        }
    }
}

void plan_hash(const Plan *p, char out[17])
{
    Fnv f = {0xcbf29ce484222325ULL};
    int nax = p->axes ? p->naxes : 0, nt = p->tensors ? p->ntensors : 0;
    int ni = p->instrs ? p->ninstrs : 0, nk = p->kernels ? p->nkernels : 0;
    fnv_i64(&f, p->version);
    fnv_str(&f, p->model);
    for (int i = 0; p->config && i < p->nconfig; i++) /* (none in older plans: their hash stays) */
        fnv_str(&f, p->config[i].name), fnv_i64(&f, p->config[i].value);
    fnv_str(&f, p->train_hash);
    fnv_i64(&f, nax < 0 ? 0 : nax);
    for (int i = 0; i < nax; i++) {
        fnv_str(&f, p->axes[i].name);
        fnv_str(&f, p->axes[i].role);
        fnv_i64(&f, p->axes[i].size);
        if (p->axes[i].stride) /* a placement (none in older plans: their hash stays) */
            fnv_i64(&f, p->axes[i].stride);
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
