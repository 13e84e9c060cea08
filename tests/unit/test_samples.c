/* test_samples.c: formulas the samples write in TDL against the papers'.
 * Each case compiles a sample at small sizes and evaluates its forward pass
 * with the float64 interpreter, then compares named values with the formula
 * written here in C. Run from the repository's root (make test does). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "tests/support/interp.h"

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s (run from the repository's root)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return s;
}

static void define(Ctx *c, const char *name, int64_t v)
{
    Define d = {.name = intern(c->strings, name), .value = v, .fvalue = (double)v};
    VEC_PUSH(c->arena, c->defines, d);
}

/* T5's relative position bucket of key j against query i (Raffel et al.,
 * 2020; the reference implementation's _relative_position_bucket): rel =
 * j - i; bidirectional, half the buckets for keys after the query; of the
 * rest, distances below half are exact, the others on a log scale up to
 * max_distance, the last bucket anything farther. */
static int64_t t5_bucket(int64_t rel, int bidirectional, int64_t buckets, int64_t max_distance)
{
    int64_t b = 0;
    if (bidirectional) {
        buckets /= 2;
        b += rel > 0 ? buckets : 0;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    int64_t exact = buckets / 2;
    if (rel < exact)
        return b + rel;
    int64_t big = exact + (int64_t)(log((double)rel / (double)exact) / log((double)max_distance / (double)exact) *
                                    (double)(buckets - exact));
    return b + (big < buckets - 1 ? big : buckets - 1);
}

/* samples/t5.tdl's position_bias: the bucket ids of the encoder (S x S,
 * bidirectional) and the decoder (T x T, causal), at a length of 300 so
 * that every bucket is reached, the log scale's too, and distances beyond
 * MAXD = 128 fall in the last. */
Test(samples, t5_relative_position_buckets)
{
    size_t len;
    char *text = read_text("samples/t5.tdl", &len);
    Ctx *c = ctx_new(stderr);
    static const char *names[] = {"L", "D", "H", "F", "V", "S", "T", "B"};
    static const int64_t values[] = {1, 8, 2, 16, 16, 300, 260, 2};
    for (int i = 0; i < 8; i++)
        define(c, names[i], values[i]);
    Graph *g = fe_compile(c, "samples/t5.tdl", text, len, NULL);
    cr_assert_not_null(g, "samples/t5.tdl does not compile");
    Interp *in = interp_new(g);
    interp_init(in, 7, 16);
    cr_assert_eq(interp_run(in), 0, "%s", in->err);
    int found = 0, seen[32] = {0};
    for (int v = 0; v < g->values.len; v++) {
        const Value *x = g->values.data[v];
        if (!x->name || strcmp(x->name, "ids") != 0)
            continue;
        int64_t n = x->shape[0];
        int both = n == 300;
        cr_assert(x->rank == 2 && (n == 300 || n == 260) && x->shape[1] == n, "ids of an unexpected shape");
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) {
                int64_t want = t5_bucket(j - i, both, 32, 128), got = (int64_t)in->buf[x->id][i * n + j];
                cr_assert_eq(got, want, "%s: query %lld, key %lld: bucket %lld, T5's %lld",
                             both ? "encoder" : "decoder", (long long)i, (long long)j, (long long)got,
                             (long long)want);
                seen[want] |= 1 << both;
            }
        found++;
    }
    cr_assert_eq(found, 2, "the encoder's and the decoder's bucket ids");
    /* every bucket is reached in both stacks, but the encoder's 16: the first
     * of the keys after the query, distance 0, which is none of them */
    for (int b = 0; b < 32; b++)
        cr_assert_eq(seen[b], b == 16 ? 1 : 3, "bucket %d: reached by the encoder %d, by the decoder %d",
                     b, seen[b] >> 1, seen[b] & 1);
    interp_free(in);
    ctx_free(c);
    free(text);
}
