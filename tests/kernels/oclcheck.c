/* oclcheck.c: every kernel of a plan run three ways on the same random inputs.
 * Reads a graph IR after all passes (what `tcc --emit=ir` prints); builds its
 * plan and Kernel IR; for each kernel runs (a) the C rendering (cc -O2
 * -fopenmp, dlopen'ed), (b) a float64 reference (the same kernel with its
 * float type and float arguments switched to f64, rendered as C) and (c) the
 * OpenCL rendering under the first OpenCL platform (PoCL), launched with
 * cg_gpu_launch's grid and block. Compares every argument afterwards: C vs
 * reference, OpenCL vs reference, OpenCL vs C. One line per kernel, a summary;
 * exit 1 naming the worst kernel when a comparison fails, 77 when there is no
 * OpenCL platform.
 *
 *   oclcheck [--seed N] [--perturb] [--drop-group] [--no-opencl] [--keep] [--unfused] FILE.tir
 *
 * --perturb changes one output element of each kernel's checked result (the
 * OpenCL one, or the C one under --no-opencl) by 1%; --drop-group launches
 * every OpenCL kernel without its last work-group. Either way every kernel
 * must fail. --unfused builds the plan with every value in a kernel of its
 * own (CG_KEEP_VALUES), so each op's kernel is checked standalone. */
#define CL_TARGET_OPENCL_VERSION 120
#include "codegen/codegen.h"
#include "passes/passes.h"

#include <CL/cl.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*KernelFn)(char *const *args);

typedef struct Opts {
    uint64_t seed;
    int perturb, drop_group, no_opencl, keep, unfused;
    const char *path;
} Opts;

typedef struct Cl {
    cl_context ctx;
    cl_command_queue q;
    cl_device_id dev;
    cl_program prog;
} Cl;

/* The errors of one comparison: the metric (see compare) and where it peaked. */
typedef struct Cmp {
    double err, tol;
    int slot;
    int64_t at; /* the worst element */
    double got, want;
    int64_t first; /* the first element beyond tolerance, or -1 */
} Cmp;

/* ---- random inputs ---- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1p-53;
}

static uint16_t f2bf(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static double bf2d(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Integers index something (token ids, targets, a shard's offset, a mesh
 * coordinate): 0 or 1 lies in range of every dimension here, and a shard
 * offset of 1 against ids 0 and 1 takes both the held and the not-held side of
 * the sharded lookups. An input with a smaller limit, or a coordinate over
 * axes of one device, gets 0. */
static int64_t int_limit(const Plan *p, const PlanTensor *t)
{
    int64_t lim = 2;
    if (t->role == PT_INPUT && t->limit > 0 && t->limit < lim)
        lim = t->limit;
    if (t->role == PT_COORD) {
        int64_t n = 1;
        for (int a = 0; a < t->ncoord; a++)
            n *= p->axes[t->coord[a]].size;
        lim = n < lim ? n : lim;
    }
    return lim;
}

/* Floats uniform in [0.25, 1]: positive and away from zero, so log, sqrt,
 * rsqrt and divisions by any input stay defined and well conditioned, and
 * sums of inputs do not cancel. The step number (PT_STEP, a whole number the
 * runtime writes) is set apart by the caller: 1 - beta^step cancels for steps
 * near 0 (at 0.25, 1 - 0.999^0.25 keeps 4 digits fewer than its operands), a
 * loss of the f32 arithmetic itself, not of any rendering. values[] holds what the kernel sees
 * (bf16 inputs rounded), as double, for the reference. */
static void fill(uint64_t *s, DType dt, int64_t lim, int64_t n, void *buf, double *values)
{
    for (int64_t i = 0; i < n; i++) {
        double x = 0.25 + 0.75 * rng_unit(s);
        switch (dt) {
        case DT_F32:
            values[i] = ((float *)buf)[i] = (float)x;
            break;
        case DT_F64:
            values[i] = ((double *)buf)[i] = x;
            break;
        case DT_BF16:
            ((uint16_t *)buf)[i] = f2bf((float)x);
            values[i] = bf2d(((uint16_t *)buf)[i]);
            break;
        case DT_I32:
            values[i] = ((int32_t *)buf)[i] = (int32_t)(rng_next(s) % (uint64_t)lim);
            break;
        default:
            BUG("no inputs for dtype %d", (int)dt);
        }
    }
}

static double load(DType dt, const void *buf, int64_t i)
{
    switch (dt) {
    case DT_F32:
        return ((const float *)buf)[i];
    case DT_F64:
        return ((const double *)buf)[i];
    case DT_BF16:
        return bf2d(((const uint16_t *)buf)[i]);
    case DT_I32:
        return ((const int32_t *)buf)[i];
    default:
        BUG("no values for dtype %d", (int)dt);
    }
}

static void store(DType dt, void *buf, int64_t i, double x)
{
    switch (dt) {
    case DT_F32:
        ((float *)buf)[i] = (float)x;
        return;
    case DT_F64:
        ((double *)buf)[i] = x;
        return;
    case DT_BF16:
        ((uint16_t *)buf)[i] = f2bf((float)x);
        return;
    case DT_I32:
        ((int32_t *)buf)[i] = (int32_t)x;
        return;
    default:
        BUG("no values for dtype %d", (int)dt);
    }
}

/* ---- the C renderings, compiled and loaded ---- */

static int sh(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "oclcheck: error: '%s' failed (status %d)\n", cmd, rc);
    return rc;
}

/* The reference: the kernel in f64, every float argument f64. */
static Kernel *reference(Arena *a, const Kernel *k)
{
    Kernel *r = arena_alloc(a, sizeof *r);
    *r = *k;
    r->name = arena_printf(a, "ref_%s", k->name);
    r->ftype = DT_F64;
    for (int j = 0; j < k->nargs; j++)
        if (k->arg_dtype[j] != DT_I32)
            r->arg_dtype[j] = DT_F64;
    return r;
}

/* The kernels and their references in one shared object under dir; NULL after reporting. */
static void *build_c(Arena *a, const char *dir, Kernel **ks, int n)
{
    char *src = arena_printf(a, "%s/kernels.c", dir), *so = arena_printf(a, "%s/kernels.so", dir);
    FILE *f = fopen(src, "w");
    if (!f) {
        fprintf(stderr, "oclcheck: error: cannot write '%s': %s\n", src, strerror(errno));
        return NULL;
    }
    fputs(cg_c_prelude(), f); /* what the plan puts before its C kernels */
    for (int i = 0; i < n; i++) {
        fputs(cg_emit_c(a, ks[i]), f);
        fputs(cg_emit_c(a, reference(a, ks[i])), f);
    }
    if (fclose(f) != 0)
        return NULL;
    if (sh(arena_printf(a, "cc -O2 -fopenmp -shared -fPIC -o %s %s -lm", so, src)) != 0)
        return NULL;
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        fprintf(stderr, "oclcheck: error: dlopen %s: %s\n", so, dlerror());
    return h;
}

/* ---- OpenCL ---- */

static const char *cl_err(cl_int e)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "OpenCL error %d", (int)e);
    return buf;
}

#define CL_CHECK(call)                                                                             \
    do {                                                                                           \
        cl_int e_ = (call);                                                                        \
        if (e_ != CL_SUCCESS) {                                                                    \
            fprintf(stderr, "oclcheck: error: %s at %s:%d: %s\n", #call, __FILE__, __LINE__,       \
                    cl_err(e_));                                                                   \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* The first device of the first platform; 1 when there is none, -1 on error. */
static int cl_open(Cl *cl)
{
    cl_platform_id plat;
    cl_uint np = 0;
    if (clGetPlatformIDs(1, &plat, &np) != CL_SUCCESS || np == 0)
        return 1;
    if (clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &cl->dev, NULL) != CL_SUCCESS)
        return 1;
    cl_int e;
    cl->ctx = clCreateContext(NULL, 1, &cl->dev, NULL, NULL, &e);
    CL_CHECK(e);
    cl->q = clCreateCommandQueue(cl->ctx, cl->dev, 0, &e);
    CL_CHECK(e);
    return 0;
}

/* One program of every kernel after the prelude; on a failed build, the log. */
static int cl_build(Cl *cl, Arena *a, const char *dir, const char *src)
{
    FILE *f = fopen(arena_printf(a, "%s/kernels.cl", dir), "w");
    if (f) {
        fputs(src, f);
        fclose(f);
    }
    cl_int e;
    cl->prog = clCreateProgramWithSource(cl->ctx, 1, &src, NULL, &e);
    CL_CHECK(e);
    if (clBuildProgram(cl->prog, 1, &cl->dev, "", NULL, NULL) == CL_SUCCESS)
        return 0;
    size_t len = 0;
    clGetProgramBuildInfo(cl->prog, cl->dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
    char *log = arena_alloc(a, len + 1);
    clGetProgramBuildInfo(cl->prog, cl->dev, CL_PROGRAM_BUILD_LOG, len, log, NULL);
    log[len] = 0;
    fprintf(stderr, "oclcheck: error: the OpenCL program (%s/kernels.cl) does not build:\n%s\n",
            dir, log);
    return -1;
}

/* Run kernel k on the OpenCL device: buffers in, launch (drop: without the last
 * work-group), buffers back. */
static int cl_run(Cl *cl, const Kernel *k, void **bufs, const size_t *bytes, const int *uniq,
                  int drop)
{
    cl_int e;
    cl_kernel kern = clCreateKernel(cl->prog, k->name, &e);
    CL_CHECK(e);
    cl_mem mem[64] = {0};
    int rc = -1;
    for (int j = 0; j < k->nargs; j++) {
        int u = uniq[j];
        if (!mem[u]) {
            /* OpenCL has no empty buffers: an empty tensor gets the spare byte of its copy */
            mem[u] = clCreateBuffer(cl->ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                    bytes[u] ? bytes[u] : 1, bufs[u], &e);
            if (e != CL_SUCCESS)
                goto out;
        }
        if ((e = clSetKernelArg(kern, (cl_uint)j, sizeof(cl_mem), &mem[u])) != CL_SUCCESS)
            goto out;
    }
    CgLaunch l = cg_gpu_launch(k);
    size_t global = (size_t)(l.grid - drop) * (size_t)l.block, local = (size_t)l.block;
    if (global && (e = clEnqueueNDRangeKernel(cl->q, kern, 1, NULL, &global, &local, 0, NULL,
                                              NULL)) != CL_SUCCESS) /* OpenCL 1.2: no empty range */
        goto out;
    for (int u = 0; u < 64; u++)
        if (mem[u] && (e = clEnqueueReadBuffer(cl->q, mem[u], CL_TRUE, 0, bytes[u] ? bytes[u] : 1,
                                               bufs[u], 0, NULL, NULL)) != CL_SUCCESS)
            goto out;
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "oclcheck: error: running %s: %s\n", k->name, cl_err(e));
    for (int u = 0; u < 64; u++)
        if (mem[u])
            clReleaseMemObject(mem[u]);
    clReleaseKernel(kern);
    return rc;
}

/* ---- comparisons ---- */

static const char *pattern_name(KPattern p)
{
    static const char *names[] = {"pointwise", "row", "attention", "attention_bwd"};
    return names[p];
}

/* The longest chain of additions behind one output element: each inner loop
 * adds its extent (times the extents of the loops around it); attention sums
 * over head_dim for a score (head_dim_v for dout v: the longer of the two)
 * and over the keys (twice: max and sum, then the weighted values; backward also over the rows of a key's group: dk over
 * the queries, dq over the keys). */
static double chain(const Kernel *k)
{
    const KAttention *a = &k->attn;
    double longer = (double)(a->seq > a->seq_k ? a->seq : a->seq_k); /* queries or keys */
    double dh = (double)(a->head_dim > a->head_dim_v ? a->head_dim : a->head_dim_v); /* q k or dout v */
    if (k->pattern == KP_ATTENTION)
        return dh + 2.0 * (double)a->seq_k;
    if (k->pattern == KP_ATTENTION_BWD)
        return 2.0 * dh + 2.0 * longer * (double)(a->heads / a->kv_heads);
    double n = 0, outer[16] = {1};
    int depth = 0;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if (t->kind == KS_LOOP && depth < 15) {
            outer[depth + 1] = outer[depth] * (double)t->extent;
            n += outer[++depth];
        } else if (t->kind == KS_END && depth > 0) {
            depth--;
        }
    }
    return n;
}

/* How much the attention backward loses to cancellation, beyond what positive
 * inputs keep: ds = p (dp - dot_o) takes the difference of two dot products
 * over head_dim that agree but for O(sqrt(head_dim)) of their O(head_dim)
 * size, and the ds of a row sum to zero, so dq and dk are sums over the keys
 * that cancel likewise (by O(sqrt(seq))). */
static double cancellation(const Kernel *k)
{
    if (k->pattern != KP_ATTENTION_BWD)
        return 1;
    return sqrt((double)k->attn.head_dim * (double)k->attn.seq);
}

/* Tolerance of results computed in float type ft, stored as dt, against the
 * exact result: u = 2^-24 (f32) or 2^-53 (f64) rounding per operation; a sum
 * of n terms errs by at most (n-1) u times the sum of their magnitudes, which
 * the positive inputs keep within a small factor of the result. 32 covers
 * that factor, the few ulp of the library's exp, log, tanh (OpenCL allows 4)
 * and the roundings of the pointwise arithmetic around the sums; 16 more terms
 * stand for the pointwise ops of a kernel without loops. A bf16 result adds
 * its storage rounding, 2^-8. */
static double tolerance(const Kernel *k, DType ft, DType dt)
{
    double u = ft == DT_F64 ? 0x1p-53 : 0x1p-24;
    double tol = 32.0 * u * (chain(k) + 16.0) * cancellation(k);
    /* OpenCL's pow may be 16 ulp off, and AdamW's bias correction 1 - beta^step
     * scales that by beta^step / (1 - beta^step) <= 9.5 (beta <= 0.999, steps
     * >= 100): 152 ulp in m^ or v^; the update p - lr m^ / sqrt(v^) then rounds
     * a difference whose terms are each as large as the result, which doubles
     * it: 320 ulp more per pow (160 failed on 1 element of 3969 under PoCL at
     * 1.03 times the tolerance, seed 1795690422058386, tests/lit/kernels/odd.test) */
    for (int i = 0; i < k->nodes.len; i++)
        tol += k->nodes.data[i].kind == KN_POW ? 320.0 * u : 0;
    if (dt == DT_BF16)
        tol += 0x1p-8;
    else if (dt == DT_F32 && ft == DT_F64)
        tol += 0x1p-24;
    return tol;
}

/* The error of got against want, n values of slot j: max over i of
 * |got - want| / (|want| + m/64), m = max |want|. Relative where the values
 * are large; for values that cancelled to near zero, relative to 1/64 of the
 * tensor's largest (their absolute error stems from terms of that size). So
 * it passes when |got - want| <= tol * (|want| + m/64) everywhere. A NaN or an
 * infinity counts as equal only to the same. */
static void compare(Cmp *c, int j, DType gdt, const void *got, DType wdt, const void *want,
                    int64_t n, int scaled)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(load(wdt, want, i)));
    for (int64_t i = 0; i < n; i++) {
        double g = load(gdt, got, i), w = load(wdt, want, i), e;
        if (!isfinite(g) || !isfinite(w))
            e = (g == w || (isnan(g) && isnan(w))) ? 0 : INFINITY;
        else if (scaled)
            e = g == w ? 0 : fabs(g - w) / m;
        else
            e = g == w ? 0 : fabs(g - w) / (fabs(w) + m / 64.0);
        if (e > c->tol && c->first < 0)
            c->first = i;
        if (e > c->err)
            *c = (Cmp){e, c->tol, j, i, g, w, c->first};
    }
}

/* The tensor-core attention (codegen/emit_attention.c) rounds each
 * probability p, and the backward each ds, to bf16 (2^-9 relative) before
 * the products that make o, dq, dk and dv, as every tensor-core attention
 * does. With this check's positive inputs the backward's ds = p (dp - D) is
 * a small difference of two large, nearly equal terms, so that rounding is
 * a large share of a small ds; and dq sums ds whose rounding errors do not
 * cancel against k's positive mean. Its OpenCL results are judged by
 * |got - want| / max |want| instead: TENSOR_CORE_TOL is 4 bf16 ulps of the
 * largest value. A wrong fragment, lane or tile gives errors of the order of
 * the values themselves (tests/lit/kernels/attention-mma.test). */
#define TENSOR_CORE_TOL 0x1p-6

static int written(const Kernel *k, int slot)
{
    if (k->pattern == KP_ATTENTION)
        return slot == 3;
    if (k->pattern == KP_ATTENTION_BWD)
        return slot >= 4;
    for (int s = 0; s < k->body.len; s++) {
        const KStmt *t = &k->body.data[s];
        if ((t->kind == KS_STORE || t->kind == KS_STORE_ADD) && t->a == slot)
            return 1;
    }
    return 0;
}

/* One element of the first written argument, the one of largest magnitude, 1% off. */
static void perturb(const Kernel *k, void **bufs, const int64_t *count, const int *uniq)
{
    for (int j = 0; j < k->nargs; j++) {
        if (!written(k, j))
            continue;
        DType dt = k->arg_dtype[j];
        int64_t best = 0;
        for (int64_t i = 1; i < count[uniq[j]]; i++)
            if (fabs(load(dt, bufs[uniq[j]], i)) > fabs(load(dt, bufs[uniq[j]], best)))
                best = i;
        double x = load(dt, bufs[uniq[j]], best);
        store(dt, bufs[uniq[j]], best, dt == DT_I32 ? x + 1 : x == 0 ? 1e-3 : x * 1.01);
        return;
    }
}

/* ---- one kernel ---- */

typedef struct Run {
    const Opts *o;
    const Plan *plan;
    uint64_t rng;
    void *so;
    Cl *cl; /* NULL under --no-opencl */
} Run;

typedef struct Result {
    Cmp c, ocl, oc;  /* C vs reference, OpenCL vs reference, OpenCL vs C */
    double worst;    /* the largest err / tol of the three */
    const char *why; /* why it could not run, or NULL */
} Result;

/* The three runs' buffers: one per distinct tensor among the slots. */
typedef struct Bufs {
    int n, uniq[64];
    DType dt[64];
    int64_t count[64];
    size_t bytes[64];
    void *in[64], *c[64], *ref[64], *ocl[64];
} Bufs;

static void bufs_fill(Run *r, const Kernel *k, Bufs *b)
{
    memset(b, 0, sizeof *b);
    for (int j = 0; j < k->nargs; j++) {
        int u = -1;
        for (int i = 0; i < j && u < 0; i++)
            if (k->args[i] == k->args[j])
                u = b->uniq[i];
        if (u >= 0) {
            b->uniq[j] = u;
            continue;
        }
        u = b->uniq[j] = b->n++;
        const PlanTensor *t = &r->plan->tensors[k->args[j]];
        DType dt = b->dt[u] = k->arg_dtype[j];
        int64_t n = b->count[u] = (int64_t)(t->bytes / ir_dtype_size(dt));
        size_t sz = b->bytes[u] = (size_t)n * ir_dtype_size(dt);
        double *vals = malloc(sizeof(double) * (size_t)n + 1);
        b->in[u] = malloc(sz + 1);
        fill(&r->rng, dt, dt == DT_I32 ? int_limit(r->plan, t) : 0, n, b->in[u], vals);
        if (t->role == PT_STEP && n == 1) /* step numbers 100..999 */
            store(dt, b->in[u], 0, vals[0] = 100 + (double)(rng_next(&r->rng) % 900));
        if ((k->pattern == KP_ATTENTION || k->pattern == KP_ATTENTION_BWD) && j == k->attn.mask)
            for (int64_t e = 0; e < n; e++) /* an attention mask: 3 keys in 4 hidden, so that
                                               with a window some queries see none */
                store(dt, b->in[u], e, vals[e] = rng_next(&r->rng) % 4 == 0);
        b->c[u] = malloc(sz + 1);
        b->ocl[u] = malloc(sz + 1);
        memcpy(b->c[u], b->in[u], sz);
        memcpy(b->ocl[u], b->in[u], sz);
        if (dt == DT_I32) {
            b->ref[u] = malloc(sz + 1);
            memcpy(b->ref[u], b->in[u], sz);
            free(vals);
        } else {
            b->ref[u] = vals;
        }
    }
}

static void bufs_free(Bufs *b)
{
    for (int u = 0; u < b->n; u++) {
        free(b->in[u]);
        free(b->c[u]);
        free(b->ref[u]);
        free(b->ocl[u]);
    }
}

static int call_c(Run *r, const char *name, void **bufs, const int *uniq, int nargs)
{
    KernelFn fn = (KernelFn)(uintptr_t)dlsym(r->so, name);
    if (!fn)
        return -1;
    char *args[64];
    for (int j = 0; j < nargs; j++)
        args[j] = bufs[uniq[j]];
    fn(args);
    return 0;
}

static void compare_all(const Kernel *k, Bufs *b, int with_ocl, Result *res)
{
    for (int u = 0; u < b->n; u++) {
        DType dt = b->dt[u], rdt = dt == DT_I32 ? DT_I32 : DT_F64;
        int j = 0;
        while (b->uniq[j] != u)
            j++;
        if (k->pattern == KP_ATTENTION_BWD && j == 7) /* the C rendering's scratch */
            continue;
        double tol = tolerance(k, k->ftype, dt);
        Cmp c = {0, tol, 0, 0, 0, 0, -1}, o = c, oc = c;
        oc.tol = 2 * tol; /* both sides err against the exact result */
        compare(&c, j, dt, b->c[u], rdt, b->ref[u], b->count[u], 0);
        if (res->c.tol < 0 || c.err / c.tol > res->c.err / res->c.tol)
            res->c = c;
        if (with_ocl) {
            int tc = cg_attention_tensor_cores(k);
            if (tc)
                o.tol = oc.tol = TENSOR_CORE_TOL;
            compare(&o, j, dt, b->ocl[u], rdt, b->ref[u], b->count[u], tc);
            compare(&oc, j, dt, b->ocl[u], dt, b->c[u], b->count[u], tc);
            if (res->ocl.tol < 0 || o.err / o.tol > res->ocl.err / res->ocl.tol)
                res->ocl = o;
            if (res->oc.tol < 0 || oc.err / oc.tol > res->oc.err / res->oc.tol)
                res->oc = oc;
        }
    }
    const Cmp *all[3] = {&res->c, &res->ocl, &res->oc};
    for (int i = 0; i < 3; i++) {
        double q = all[i]->tol > 0 ? all[i]->err / all[i]->tol : 0; /* tol < 0: not run */
        res->worst = fmax(res->worst, q);
    }
}

static void check_kernel(Run *r, const Kernel *k, int has_ocl, Result *res)
{
    Bufs b;
    memset(res, 0, sizeof *res);
    res->c.tol = res->ocl.tol = res->oc.tol = -1; /* none yet */
    bufs_fill(r, k, &b);
    Arena *a = k->arena;
    if (call_c(r, k->name, b.c, b.uniq, k->nargs) != 0 ||
        call_c(r, arena_printf(a, "ref_%s", k->name), b.ref, b.uniq, k->nargs) != 0) {
        res->why = "no C symbol";
    } else if (r->cl && !has_ocl) {
        res->why = "no OpenCL rendering";
    } else if (r->cl && cl_run(r->cl, k, b.ocl, b.bytes, b.uniq, r->o->drop_group) != 0) {
        res->why = "the OpenCL run failed";
    } else {
        if (r->o->perturb)
            perturb(k, r->cl ? b.ocl : b.c, b.count, b.uniq);
        compare_all(k, &b, r->cl != NULL, res);
    }
    if (res->why)
        res->worst = INFINITY;
    bufs_free(&b);
}

/* ---- report ---- */

static void print_cmp(const char *what, const Kernel *k, const Cmp *c)
{
    if (c->tol < 0 || c->err <= c->tol) /* not run, or within tolerance */
        return;
    printf("    %s: argument %d (tensor %d) element %lld: %.9g against %.17g (error %.2e > "
           "tolerance %.2e; first bad element %lld)\n",
           what, c->slot, k->args[c->slot], (long long)c->at, c->got, c->want, c->err, c->tol,
           (long long)c->first);
}

static void print_kernel(const Run *r, const Kernel *k, const Result *res)
{
    CgLaunch l = cg_gpu_launch(k);
    printf("%-30s %-13s extent %-8lld launch %lldx%-5d c %.1e  ocl %.1e  ocl-c %.1e  tol %.1e  "
           "%s\n",
           k->name, pattern_name(k->pattern), (long long)k->extent, (long long)l.grid, l.block,
           res->c.err, res->ocl.err, res->oc.err, res->c.tol, res->worst <= 1 ? "ok" : "FAIL");
    if (res->why)
        printf("    %s\n", res->why);
    print_cmp("C against the f64 reference", k, &res->c);
    print_cmp("OpenCL against the f64 reference", k, &res->ocl);
    print_cmp("OpenCL against C", k, &res->oc);
    fflush(stdout);
}

/* ---- main ---- */

static int usage(void)
{
    fprintf(
        stderr,
        "usage: oclcheck [--seed N] [--perturb] [--drop-group] [--no-opencl] [--keep] [--unfused] "
        "FILE.tir\n");
    return 2;
}

static int parse_args(int argc, char **argv, Opts *o)
{
    o->seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            o->seed = strtoull(argv[++i], &end, 0);
            if (*end) {
                fprintf(stderr, "oclcheck: error: --seed %s: not a number\n", argv[i]);
                return -1;
            }
        } else if (!strcmp(argv[i], "--perturb")) {
            o->perturb = 1;
        } else if (!strcmp(argv[i], "--drop-group")) {
            o->drop_group = 1;
        } else if (!strcmp(argv[i], "--no-opencl")) {
            o->no_opencl = 1;
        } else if (!strcmp(argv[i], "--keep")) {
            o->keep = 1;
        } else if (!strcmp(argv[i], "--unfused")) {
            o->unfused = 1;
        } else if (argv[i][0] == '-' || o->path) {
            usage();
            return -1;
        } else {
            o->path = argv[i];
        }
    }
    if (!o->path) {
        usage();
        return -1;
    }
    return 0;
}

/* The graph of the IR file, its plan and kernels; -1 after reporting. */
static int load_plan(Ctx *c, const char *path, int flags, Plan *plan, Kernel ***ks)
{
    size_t len;
    char *text = read_file(c->arena, path, &len);
    if (!text) {
        fprintf(stderr, "oclcheck: error: cannot read '%s': %s\n", path, strerror(errno));
        return -1;
    }
    Graph *g = ir_parse(c, path, text, len);
    Settings s;
    if (!g || ir_verify(c, g) != 0 || pass_settings(c, g, &s) != 0 ||
        cg_build_plan_ir(c, g, &s.train, flags, plan, ks) != 0)
        return -1;
    return 0;
}

/* The OpenCL source of every kernel that has one (has[i]). */
static char *opencl_source(Arena *a, Kernel **ks, int n, int *has)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        BUG("open_memstream failed");
    fputs(cg_gpu_prelude(CG_OPENCL), f);
    for (int i = 0; i < n; i++) {
        char *s = cg_emit_gpu(a, ks[i], CG_OPENCL);
        has[i] = s != NULL;
        if (s)
            fputs(s, f);
    }
    fclose(f);
    char *s = arena_strdup(a, buf);
    free(buf);
    return s;
}

static int check_all(Run *r, Kernel **ks, int n, const int *has)
{
    int failed = 0, worst = -1;
    double worst_q = -1;
    for (int i = 0; i < n; i++) {
        Result res;
        check_kernel(r, ks[i], has[i], &res);
        print_kernel(r, ks[i], &res);
        failed += !(res.worst <= 1);
        if (worst < 0 || !(res.worst <= worst_q)) {
            worst = i;
            worst_q = res.worst;
        }
    }
    printf("oclcheck: %d kernels, %d failed (seed %llu%s); largest error %.3g of its tolerance "
           "(%s)\n",
           n, failed, (unsigned long long)r->o->seed, r->cl ? "" : ", no OpenCL", worst_q,
           n ? ks[worst]->name : "none");
    if (failed)
        printf("oclcheck: FAIL: worst kernel %s (error %.3g times its tolerance)\n",
               ks[worst]->name, worst_q);
    return failed ? 1 : 0;
}

/* Checks every kernel; sets o->keep when the sources are worth keeping (a failed build). */
static int run(Ctx *c, Opts *o, const char *dir)
{
    Plan plan;
    Kernel **ks;
    if (load_plan(c, o->path, o->unfused ? CG_KEEP_VALUES : 0, &plan, &ks) != 0)
        return 1;
    printf("oclcheck: %s: %d kernels, seed %llu\n", o->path, plan.nkernels,
           (unsigned long long)o->seed);
    Cl cl;
    Run r = {o, &plan, o->seed, NULL, NULL};
    int *has = arena_alloc(c->arena, sizeof(int) * (size_t)(plan.nkernels + 1));
    if (!o->no_opencl) {
        int rc = cl_open(&cl);
        if (rc > 0) {
            printf("oclcheck: no OpenCL platform: skipped\n");
            return 77;
        }
        if (rc < 0)
            return 1;
        if (cl_build(&cl, c->arena, dir, opencl_source(c->arena, ks, plan.nkernels, has)) != 0) {
            o->keep = 1;
            return 1;
        }
        r.cl = &cl;
    }
    if (!(r.so = build_c(c->arena, dir, ks, plan.nkernels))) {
        o->keep = 1;
        return 1;
    }
    int rc = check_all(&r, ks, plan.nkernels, has);
    /* r.so stays loaded: dlclose would unload the OpenMP runtime under its idle threads */
    if (r.cl) {
        clReleaseProgram(cl.prog);
        clReleaseCommandQueue(cl.q);
        clReleaseContext(cl.ctx);
    }
    return rc;
}

int main(int argc, char **argv)
{
    Opts o = {0};
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/oclcheck.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "oclcheck: error: mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }
    Ctx *c = ctx_new(stderr);
    int rc = run(c, &o, dir);
    ctx_free(c);
    if (o.keep) {
        fprintf(stderr, "oclcheck: sources kept in %s\n", dir);
    } else {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "oclcheck: warning: could not remove %s\n", dir);
    }
    return rc;
}
