/* json_read.c: a plan read from JSON (plan_load, plan_parse) and released
 * (plan_free; docs/plan.md).
 * Reads: plan.json, or its text in memory. Writes: a heap Plan, a loop plan
 * expanded into the program the executors run (plan_expand), or a one-line
 * message that names the file and the field, e.g. "tensors[3].shape".
 * Key idea: the loader trusts nothing. It first reads the JSON into a Plan,
 * checking only what the JSON can say (types, names, unknown or repeated
 * fields, integers that fit); then plan_check checks the meaning on the
 * struct (check.c), so a plan built in memory gets the same checks; last the
 * hash (hash.c), so an edit that leaves a plan valid is refused too. A
 * truncated or foreign file is named as such. Depends on cJSON and libc
 * only. */
#include "plan/plan_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES ((size_t)1 << 31)

/* "at.key", or "key" at the top level. */
static const char *field(char *buf, size_t n, const char *at, const char *key)
{
    snprintf(buf, n, "%s%s%s", at, *at && key ? "." : "", key ? key : "");
    return buf;
}

/* o must be an object whose keys are all in allowed (NULL-terminated), each once. */
static int rd_keys(const cJSON *o, const char *at, const char *const *allowed, char *err, size_t n)
{
    char q[PLAN_SHOWN];
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
                       plan_shown(q, c->string));
        for (const cJSON *d = o->child; d != c; d = d->next)
            if (!strcmp(c->string, d->string))
                return plan_errorf(err, n, "%s%sfield \"%s\" appears twice", at, *at ? ": " : "",
                           plan_shown(q, c->string));
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
    if (!(d >= -(double)PLAN_JSON_EXACT && d <= (double)PLAN_JSON_EXACT) || d != floor(d))
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
    if (rd_int(o, at, key, 0, PLAN_JSON_EXACT, &v, err, n))
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
    char f[128], q[PLAN_SHOWN];
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
               plan_shown(q, v->valuestring));
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
        rd_enum(o, at, "dtype", plan_dtype_names, PD_COUNT, "dtype", &dt, err, n) ||
        rd_ints(o, at, "shape", PLAN_MAX_RANK, -PLAN_JSON_EXACT, PLAN_JSON_EXACT, &shape, &t->rank, err, n))
        return -1;
    t->dtype = (PlanDType)dt;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)t->rank);
    free(shape);
    if (rd_u64(o, at, "offset", &t->offset, err, n) || rd_u64(o, at, "bytes", &t->bytes, err, n) ||
        rd_enum(o, at, "role", plan_role_names, PT_COUNT, "role", &role, err, n) ||
        rd_str(o, at, "init", &t->init, err, n) ||
        rd_num(o, at, "init_arg", &t->init_arg, err, n) ||
        rd_i32(o, at, "layer", &t->layer, err, n) ||
        rd_int(o, at, "limit", -PLAN_JSON_EXACT, PLAN_JSON_EXACT, &t->limit, err, n) ||
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
        if (rd_int(o, at, keys[5 + j], -PLAN_JSON_EXACT, PLAN_JSON_EXACT, longs[j], err, n))
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
    if (rd_enum(o, at, "op", plan_coll_names, PC_COUNT, "collective", &op, err, n) ||
        rd_axes(o, at, "axes", c->axes, &c->naxes, err, n) ||
        rd_i32(o, at, "dim", &c->dim, err, n) || rd_i32(o, at, "dim2", &c->dim2, err, n) ||
        rd_int(o, at, "bytes", 0, PLAN_JSON_EXACT, &c->bytes, err, n))
        return -1;
    c->op = (PlanCollKind)op;
    if (plan_is_p2p(c->op)) {
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
        {"kind", "args", "gemm", "phase", "layer", "stage", "piece", "when", "acc", NULL},
        {"kind", "args", "phase", "layer", "stage", "piece", "when", "rows", NULL},
        {"kind", "op", "args", "axes", "dim", "dim2", "bytes", "peer", "tag", "phase", "layer",
         "stage", "piece", "when", NULL},
    };
    int kind;
    int64_t *args = NULL;
    char f[64];
    if (!cJSON_IsObject(o))
        return plan_errorf(err, n, "%s: expected an object", at);
    if (rd_enum(o, at, "kind", plan_kind_names, PI_COUNT, "instruction kind", &kind, err, n) ||
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
        ((kind == PI_KERNEL || kind == PI_GEMM) && rd_opt_i32(o, at, "acc", 0, &in->acc, err, n)) ||
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
    static const char *const keys[] = {"name", "role", "size", "stride", NULL};
    PlanAxis *a = item;
    if (rd_keys(o, at, keys, err, n) || rd_str(o, at, "name", &a->name, err, n) ||
        rd_str(o, at, "role", &a->role, err, n) || rd_i32(o, at, "size", &a->size, err, n))
        return -1;
    a->stride = 0; /* none: row-major */
    return cJSON_GetObjectItemCaseSensitive(o, "stride")
               ? rd_int(o, at, "stride", 1, (int64_t)1 << 62, &a->stride, err, n)
               : 0;
}

static int rd_kernel_one(const cJSON *o, const char *at, void *item, char *err, size_t n)
{
    static const char *const keys[] = {"name", "nargs", "pattern", "grid", "block", NULL};
    PlanKernel *k = item;
    if (rd_keys(o, at, keys, err, n) || rd_str(o, at, "name", &k->name, err, n) ||
        rd_i32(o, at, "nargs", &k->nargs, err, n) || rd_i32(o, at, "pattern", &k->pattern, err, n) ||
        rd_int(o, at, "grid", 0, PLAN_JSON_EXACT, &k->grid, err, n) ||
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
            rd_ints(c, at, "base", p->microbatches, 0, PLAN_JSON_EXACT, &base, &nb, err, n))
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
    char q[PLAN_SHOWN];
    if (!cJSON_IsObject(root))
        return plan_errorf(err, n, "not a tcc plan: the top level is not a JSON object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!fmt)
        return plan_errorf(err, n, "not a tcc plan: \"format\" is missing, expected \"%s\"", PLAN_FORMAT);
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, PLAN_FORMAT))
        return plan_errorf(err, n, "not a tcc plan: \"format\" is \"%s\", expected \"%s\"",
                   cJSON_IsString(fmt) ? plan_shown(q, fmt->valuestring) : "(not a string)",
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
    if (rd_ints(root, "", "stage_slab_bytes", stages, 0, PLAN_JSON_EXACT, &slabs, &count, err, n))
        return -1;
    p->stage_slab_bytes = (uint64_t *)slabs;
    if (count != stages)
        return plan_errorf(err, n, "stage_slab_bytes: %d sizes for %d pipeline stages", count,
                           stages);
    return 0;
}

/* config: the model's integer parameters, {"NAME": integer, ...}; absent in
 * plans written before it. */
static int rd_config(const cJSON *root, Plan *p, char *err, size_t n)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "config");
    p->nconfig = 0, p->config = NULL;
    if (!c)
        return 0;
    if (!cJSON_IsObject(c))
        return plan_errorf(err, n, "config: expected an object of integers");
    int k = cJSON_GetArraySize(c);
    if (!(p->config = calloc((size_t)k + 1, sizeof *p->config)))
        return plan_errorf(err, n, "calloc: out of memory");
    for (const cJSON *e = c->child; e; e = e->next) {
        int64_t v;
        if (!e->string || !e->string[0] || !json_int(e, &v))
            return plan_errorf(err, n, "config.%s: expected an integer",
                               e->string ? e->string : "");
        if (!(p->config[p->nconfig].name = strdup(e->string)))
            return plan_errorf(err, n, "strdup: out of memory");
        p->config[p->nconfig++].value = v;
    }
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
        rd_int(root, "", "seed", -1, PLAN_JSON_EXACT, &p->seed, err, n))
        return -1;
    return 0;
}

static int rd_plan(const cJSON *root, Plan *p, char *hash, char *err, size_t n)
{
    static const char *const keys[] = {
        "format",     "version",          "hash",    "model",         "train_hash", "axes",
        "slab_bytes", "stage_slab_bytes", "tensors", "kernels",       "instrs",     "loss",
        "lr",         "grad_norm",        "flops",   "kernel_source", "gpu_source", "steps",
        "seed",       "microbatches", "ntags", "sched", "frames", "config", NULL};
    int rc;
    if (rd_header(root, p, hash, err, n) || rd_keys(root, "", keys, err, n) ||
        rd_str(root, "", "model", &p->model, err, n) ||
        rd_u64(root, "", "slab_bytes", &p->slab_bytes, err, n))
        return -1;
    p->axes = rd_each(root, "axes", sizeof(PlanAxis), &p->naxes, rd_axis_one, &rc, err, n);
    if (rc || rd_train_hash(root, p, err, n) || rd_stage_slabs(root, p, err, n) ||
        rd_config(root, p, err, n))
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
    for (int i = 0; p->config && i < p->nconfig; i++)
        free(p->config[i].name);
    free(p->config);
    free(p->kernel_source);
    free(p->gpu_source);
    free(p);
}
