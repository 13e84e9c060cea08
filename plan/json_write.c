/* json_write.c: a Plan written as JSON (plan_to_json, plan_write;
 * docs/plan.md), with its hash recomputed.
 * Reads: a Plan in memory (the compiler's, or an edited loaded one). Writes:
 * the JSON text, or plan.json atomically (PATH.tmp, fsync, rename).
 * Key idea: numbers are printed by hand, an integer as itself and a double in
 * the shortest of 15 to 17 digits that reads back exactly, because the hash is
 * over the values: a plan must load with every bit it was written with.
 * Integers beyond 2^53 are refused rather than rounded, as are enum values
 * without a name. Depends on cJSON and libc only. */
#include "plan/plan_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    if (v > PLAN_JSON_EXACT || v < -PLAN_JSON_EXACT)
        wr_fail(w, "%s%s%s: %" PRId64 " is beyond 2^53, which JSON numbers do not hold exactly", at,
                *at ? "." : "", key, v);
    else
        wr_add(w, o, key, cJSON_CreateRaw(buf));
}

static void wr_u64(Wr *w, cJSON *o, const char *at, const char *key, uint64_t v)
{
    if (v > (uint64_t)PLAN_JSON_EXACT)
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
    wr_add(w, o, key, cJSON_CreateString(plan_str_or_empty(s)));
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
    wr_str(w, o, "dtype", wr_name(w, at, "dtype", plan_dtype_names, PD_COUNT, t->dtype));
    cJSON *shape = wr_add(w, o, "shape", cJSON_CreateArray());
    if (t->rank < 0 || t->rank > PLAN_MAX_RANK)
        wr_fail(w, "%s.rank: %d is outside [0, %d]", at, t->rank, PLAN_MAX_RANK);
    for (int d = 0; d < t->rank && d < PLAN_MAX_RANK && shape; d++)
        wr_int(w, shape, at, "shape", t->shape[d]);
    wr_u64(w, o, at, "offset", t->offset);
    wr_u64(w, o, at, "bytes", t->bytes);
    wr_str(w, o, "role", wr_name(w, at, "role", plan_role_names, PT_COUNT, t->role));
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
    wr_str(w, o, "kind", wr_name(w, at, "kind", plan_kind_names, PI_COUNT, in->kind));
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
        wr_str(w, o, "op", wr_name(w, at, "op", plan_coll_names, PC_COUNT, c->op));
        cJSON *axes = wr_add(w, o, "axes", cJSON_CreateArray());
        for (int j = 0; j < c->naxes && j < PLAN_MAX_AXES && axes; j++)
            wr_int(w, axes, at, "axes", c->axes[j]);
        wr_int(w, o, at, "dim", c->dim);
        wr_int(w, o, at, "dim2", c->dim2);
        wr_int(w, o, at, "bytes", c->bytes);
        if (plan_is_p2p(c->op)) {
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
        if (p->axes[i].stride)
            wr_int(w, o, at, "stride", p->axes[i].stride);
    }
    wr_u64(w, root, "", "slab_bytes", p->slab_bytes);
    cJSON *slabs = wr_add(w, root, "stage_slab_bytes", cJSON_CreateArray());
    for (int s = 0; s < plan_stages(p) && slabs; s++) {
        char buf[32];
        snprintf(buf, sizeof buf, "%" PRIu64, plan_stage_slab(p, s));
        if (plan_stage_slab(p, s) > (uint64_t)PLAN_JSON_EXACT)
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
    if (p->nconfig > 0) {
        cJSON *cfg = cJSON_AddObjectToObject(root, "config");
        if (!cfg)
            wr_fail(w, "cJSON: out of memory");
        for (int i = 0; cfg && i < p->nconfig; i++)
            wr_int(w, cfg, "config", p->config[i].name, p->config[i].value);
    }
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
