/* init.c: initial values: parameters from their init, optimizer state to
 * zeros, random inputs; and the bf16/f16 conversions they store through.
 * Reads: the plan's tensor table and a seed. Writes: tensors in the slab.
 * Key idea: each tensor draws from its own stream, seeded by the run's seed
 * and the tensor's name (FNV-1a 64), so a tensor's values do not depend on
 * which other tensors a plan has or in what order. The generator is
 * splitmix64 (docs/plan.md gives the exact recipe): the same seed gives the
 * same values on every machine. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <stdio.h>
#include <stdlib.h>

#include "runtime/exec.h"

#define GOLDEN 0x9e3779b97f4a7c15ULL
#define TWO_PI 6.283185307179586476925286766559

typedef struct Rng {
    uint64_t s;
} Rng;

static uint64_t rng_next(Rng *r)
{
    uint64_t z = (r->s += GOLDEN);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* In [0, 1), 53 random bits. */
static double rng_uniform(Rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static Rng rng_for(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *s = name ? name : ""; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return (Rng){h ^ (seed * GOLDEN)};
}

/* ---- bf16 / f16 ---- */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t rt_f32_to_f16(float x)
{
    uint32_t u = bits_of(x), sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a > 0x7f800000)
        return (uint16_t)(sign | 0x7e00);
    if (a >= 0x477ff000) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000) { /* below 2^-14: subnormal; the addition rounds to 2^-24 units */
        float f = float_of(a) + 0.5f;
        return (uint16_t)(sign | (bits_of(f) - 0x3f000000));
    }
    a += 0xc8000fffU + ((a >> 13) & 1); /* exponent bias 127 -> 15, round to even */
    return (uint16_t)(sign | (a >> 13));
}

float rt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float f = (float)m * 0x1.0p-24f;
        return sign ? -f : f;
    }
    if (e == 31)
        return float_of(sign | 0x7f800000 | (m << 13));
    return float_of(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- filling tensors ---- */

static void store(void *base, PlanDType t, int64_t i, double v)
{
    uint16_t h;
    switch (t) {
    case PD_F32:
        ((float *)base)[i] = (float)v;
        return;
    case PD_F64:
        ((double *)base)[i] = v;
        return;
    case PD_BF16:
        h = rt_f32_to_bf16((float)v);
        break;
    case PD_F16:
        h = rt_f32_to_f16((float)v);
        break;
    case PD_I32:
        ((int32_t *)base)[i] = v >= 2147483647.0    ? INT32_MAX
                               : v <= -2147483648.0 ? INT32_MIN
                                                    : (int32_t)lrint(v);
        return;
    default:
        return;
    }
    ((uint16_t *)base)[i] = h;
}

static int64_t numel(const PlanTensor *t)
{
    return (int64_t)(t->bytes / plan_dtype_size(t->dtype));
}

static int is_split(const PlanTensor *t)
{
    for (int d = 0; d < t->rank; d++)
        if (t->nsplit[d])
            return 1;
    return 0;
}

/* t as a whole tensor: its global shape, no split. */
static PlanTensor whole(const Plan *p, const PlanTensor *t)
{
    PlanTensor g = *t;
    rt_global_shape(p, t, g.shape);
    g.bytes = plan_dtype_size(t->dtype);
    for (int d = 0; d < t->rank; d++)
        g.bytes *= (uint64_t)g.shape[d], g.nsplit[d] = 0;
    return g;
}

/* fill(global value of t) then this device's block of it: a split tensor gets
 * the same values as the whole one on one device. */
static void fill_block(Runtime *rt, int i, uint64_t seed,
                       void (*fill)(void *, const PlanTensor *, uint64_t))
{
    const PlanTensor *t = &rt_plan(rt)->tensors[i];
    if (!is_split(t)) {
        fill(rt_tensor_data(rt, i), t, seed);
        return;
    }
    PlanTensor g = whole(rt_plan(rt), t);
    void *buf = malloc(g.bytes + 1);
    if (!buf) {
        fprintf(stderr, "tcc: out of memory initialising '%s'\n", t->name);
        exit(1);
    }
    fill(buf, &g, seed);
    rt_block_copy(rt, t, buf, rt_tensor_data(rt, i), 0);
    free(buf);
}

/* Box-Muller: each pair of uniforms gives two normals, for elements 2i and 2i+1. */
static void fill_normal(void *base, const PlanTensor *t, Rng *r, double mean, double std)
{
    int64_t n = numel(t);
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r); /* u1 in (0, 1] */
        double rad = sqrt(-2.0 * log(u1));
        store(base, t->dtype, i, mean + std * rad * cos(TWO_PI * u2));
        if (i + 1 < n)
            store(base, t->dtype, i + 1, mean + std * rad * sin(TWO_PI * u2));
    }
}

static void fill_const(void *base, const PlanTensor *t, double v)
{
    for (int64_t i = 0; i < numel(t); i++)
        store(base, t->dtype, i, v);
}

static void init_param(void *base, const PlanTensor *t, uint64_t seed)
{
    Rng r = rng_for(seed, t->name);
    const char *init = t->init ? t->init : "";
    double a = t->init_arg;
    if (!strcmp(init, "normal"))
        fill_normal(base, t, &r, 0, a);
    else if (!strcmp(init, "uniform"))
        for (int64_t i = 0; i < numel(t); i++)
            store(base, t->dtype, i, a * (2 * rng_uniform(&r) - 1));
    else
        fill_const(base, t, !strcmp(init, "ones") ? 1 : !strcmp(init, "constant") ? a : 0);
}

/* Dropout's row keys: row r of the whole batch gets k0 + r (mod 2^32), k0
 * from the seed, so every row has its own key and a split batch's rows the
 * keys they have on one device. */
static void fill_keys(void *base, const PlanTensor *t, uint64_t seed)
{
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    uint32_t k0 = (uint32_t)(z ^ (z >> 31));
    for (int64_t r = 0; r < numel(t); r++)
        ((int32_t *)base)[r] = (int32_t)(k0 + (uint32_t)r);
}

void rt_init_keys(Runtime *rt, uint64_t seed)
{
    const Plan *p = rt_plan(rt);
    for (int i = 0; i < p->ntensors; i++)
        if (rt_holds(rt, i) && plan_is_keys(&p->tensors[i]))
            fill_block(rt, i, seed, fill_keys);
}

void rt_init_params(Runtime *rt, uint64_t seed)
{
    const Plan *p = rt_plan(rt);
    for (int i = 0; i < p->ntensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (!rt_holds(rt, i)) /* another pipeline stage's */
            continue;
        if (t->role == PT_PARAM)
            fill_block(rt, i, seed, init_param);
        else if (t->role == PT_STATE)
            memset(rt_tensor_data(rt, i), 0, t->bytes);
        else if (t->role == PT_HYPER && t->dtype == PD_F64)
            *(double *)rt_tensor_data(rt, i) = t->init_arg;
        else if (t->role == PT_HYPER)
            *(float *)rt_tensor_data(rt, i) = (float)t->init_arg;
    }
    rt_init_keys(rt, seed);
}

static void random_input(void *base, const PlanTensor *t, uint64_t seed)
{
    Rng r = rng_for(seed, t->name);
    uint64_t limit = t->limit > 0 ? (uint64_t)t->limit : 2;
    if (t->dtype == PD_I32)
        for (int64_t j = 0; j < numel(t); j++)
            ((int32_t *)base)[j] = (int32_t)(rng_next(&r) % limit);
    else
        fill_normal(base, t, &r, 0, 1);
}

void rt_random_inputs(Runtime *rt, uint64_t seed)
{
    const Plan *p = rt_plan(rt);
    for (int i = 0; i < p->ntensors; i++)
        if (p->tensors[i].role == PT_INPUT && !plan_is_keys(&p->tensors[i]))
            fill_block(rt, i, seed, random_input);
}
