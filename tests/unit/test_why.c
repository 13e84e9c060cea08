/* test_why.c: the why-chains of --why (explain/why.c) and the questions they
 * ask the sharding rules (shard_weigh, shard_axis_from in
 * passes/shard_rules.c). GPT-2 and Llama, shrunk, are sharded over a 2 x 2
 * mesh (also with zero = 3 and sequence parallelism). Checks: for every op,
 * the first way shard_weigh lists is the strategy shard_strategy picks, so
 * the chain's "chosen" line is what the pass did; for every split or partial
 * axis of every value the sweep set, shard_axis_from names an operand that
 * carries it, or the op made it and the value's reason says it came from its
 * readers; every named value's chain prints after the partition pass and
 * ends with its count of collectives; names: an unknown one is refused with
 * an error, a name without its layer index finds layer 0, %N finds the value
 * printed as %N after the shard pass. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "explain/explain.h"
#include "passes/shard.h"
#include "tests/support/settings.h"
#include "tests/support/programs.h"

#define GPT2_LINE "model gpt2(V = 64, S = 8, D = 32, H = 2, L = 2, B = 16)"
#define LLAMA_LINE "model llama(V = 64, S = 8, D = 32, H = 4, KV = 2, F = 48, L = 2, B = 8)"

/* The sample over a 2 x 2 mesh, passes run up to and including `last`,
 * with extra train settings (key, value pairs, NULL-ended). */
static Graph *build(Ctx *c, const char *file, const char *line, const char *last,
                    const char *const *sets)
{
    const char *src = test_sample(file, line);
    cr_assert_not_null(src, "cannot read samples/%s (run the tests from the project root)", file);
    Graph *g = fe_compile(c, file, src, strlen(src), &(FeOptions){.mesh = "2x2"});
    cr_assert_not_null(g, "the sample does not compile");
    for (int i = 0; sets && sets[i]; i += 2) {
        const char *key = intern(g->strings, sets[i]);
        int v = atoi(sets[i + 1]);
        VEC_PUSH(g->arena, g->train,
                 strcmp(key, "zero") ? ir_attr_bool(g->arena, key, v)
                                     : ir_attr_int(g->arena, key, v));
    }
    for (const Pass *p = pass_table; p->name; p++) {
        cr_assert_eq(p->run(c, g, ts_settings(c, g, 0)), 0, "pass %s failed", p->name);
        if (!strcmp(p->name, last))
            break;
    }
    return g;
}

static const char *const ZERO3_SP[] = {"zero", "3", "sequence_parallel", "1", NULL};

static void each_config(void (*check)(const char *file, const char *line, const char *const *s))
{
    check("gpt2.tdl", GPT2_LINE, NULL);
    check("llama.tdl", LLAMA_LINE, NULL);
    check("llama.tdl", LLAMA_LINE, ZERO3_SP);
}

static void first_way_is_pick(const char *file, const char *line, const char *const *sets)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, file, line, "shard", sets);
    ShardOpts o;
    shard_opts(g, (int)ts_settings(c, g, 0)->train.sequence_parallel, &o);
    Strategy *ways = arena_alloc(g->arena, sizeof(Strategy) * 64);
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (!op->nargs || !op->nres || op->kind == OP_UPDATE)
            continue;
        Strategy st;
        shard_strategy(g, op, &o, &st);
        int n = shard_weigh(g, op, &o, ways, 64);
        cr_assert_gt(n, 0, "%s: no way for op %d (%s)", file, i, ir_ops[op->kind].name);
        for (int k = 1; k < n; k++)
            cr_assert_geq(ways[k].cost, ways[k - 1].cost, "%s: ways out of order", file);
        for (int r = 0; r < op->nres && r < SH_MAXRES; r++)
            cr_assert(shard_same(&ways[0].out[r], &st.out[r], op->res[r]->rank),
                      "%s: op %d (%s): the first way is not the strategy picked", file, i,
                      ir_ops[op->kind].name);
        cr_assert_float_eq(ways[0].comm, st.comm, 1e-9, "%s: op %d: cost differs", file, i);
    }
    ctx_free(c);
}

Test(why, first_way_weighed_is_the_strategy_picked)
{
    each_config(first_way_is_pick);
}

static int axis_of(const Sharding *sh, int rank, int ax)
{
    for (int d = 0; d < rank; d++)
        for (int i = 0; i < sh->naxes[d]; i++)
            if (sh->axes[d][i] == ax)
                return 1;
    return (int)(sh->partial >> ax & 1);
}

/* Every axis of a value the sweep set comes from an operand that carries
 * it, or from the value's readers. */
static void axes_have_sources(const char *file, const char *line, const char *const *sets)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, file, line, "shard", sets);
    ShardOpts o;
    shard_opts(g, (int)ts_settings(c, g, 0)->train.sequence_parallel, &o);
    int followed = 0;
    for (int i = 0; i < g->ops.len; i++) {
        const Op *op = g->ops.data[i];
        if (!op->nargs || op->kind == OP_UPDATE)
            continue;
        Strategy st;
        shard_strategy(g, op, &o, &st);
        for (int r = 0; r < op->nres && r < SH_MAXRES; r++) {
            const Value *v = op->res[r];
            if (shard_pinned(&v->shard) || !shard_same(&st.out[r], &v->shard, v->rank))
                continue;
            for (int ax = 0; ax < g->mesh.naxes; ax++) {
                if (!axis_of(&v->shard, v->rank, ax))
                    continue;
                AxisFrom from;
                shard_axis_from(op, &st, r, ax, &from);
                if (from.how == FROM_NONE) {
                    const char *d = v->shard.why.detail ? v->shard.why.detail : "";
                    cr_assert(strstr(d, "readers") || strstr(d, "hint"),
                              "%s: op %d (%s) made axis %d, reason '%s'", file, i,
                              ir_ops[op->kind].name, ax, d);
                    continue;
                }
                const Value *x = op->args[from.arg];
                const Sharding *sh = from.moved ? &st.req[from.arg] : &x->shard;
                cr_assert(axis_of(sh, x->rank, ax), "%s: op %d: operand %d lacks axis %d", file, i,
                          from.arg, ax);
                followed += !from.moved;
            }
        }
    }
    cr_assert_gt(followed, 100, "%s: only %d axes followed", file, followed);
    ctx_free(c);
}

Test(why, every_propagated_axis_has_a_source)
{
    each_config(axes_have_sources);
}

/* The chain of name, printed after the partition pass, into the arena. */
static char *chain(Ctx *c, Graph *g, WhyChain *w)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert(f && w);
    ex_why_print(f, w);
    fclose(f);
    char *s = arena_strdup(c->arena, buf);
    free(buf);
    (void)g;
    return s;
}

static void every_name_prints(const char *file, const char *line, const char *const *sets)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, file, line, "shard", sets);
    const char **names = arena_alloc(g->arena, sizeof(char *) * (size_t)(g->values.len + 1));
    WhyChain **w = arena_alloc(g->arena, sizeof(WhyChain *) * (size_t)(g->values.len + 1));
    int n = 0;
    for (int i = 0; i < g->values.len; i++) {
        const char *name = g->values.data[i]->name;
        int seen = !name;
        for (int k = 0; k < n && !seen; k++)
            seen = names[k] == name;
        if (!seen) {
            names[n] = name;
            w[n] = ex_why_trace(c, g, ts_settings(c, g, 0), name);
            cr_assert_not_null(w[n], "%s: '%s' not found", file, name);
            n++;
        }
    }
    cr_assert_eq(pass_partition(c, g, ts_settings(c, g, 0)), 0);
    for (int k = 0; k < n; k++) {
        char *s = chain(c, g, w[k]);
        char head[600];
        snprintf(head, sizeof head, "why '%s' %%", names[k]);
        cr_assert(!strncmp(s, head, strlen(head)), "%s: '%s' starts: %.80s", file, names[k], s);
        cr_assert_not_null(strstr(s, "\nin all: "), "%s: '%s' has no total", file, names[k]);
    }
    cr_assert_eq(c->diag.nerrors, 0);
    ctx_free(c);
}

Test(why, every_named_value_has_a_chain)
{
    each_config(every_name_prints);
}

Test(why, names)
{
    Ctx *c = ctx_new(stderr);
    Graph *g = build(c, "llama.tdl", LLAMA_LINE, "shard", NULL);
    FILE *quiet = fopen("/dev/null", "w");
    c->diag.out = quiet;
    cr_assert_null(ex_why_trace(c, g, ts_settings(c, g, 0), "wqq"));
    cr_assert_null(ex_why_trace(c, g, ts_settings(c, g, 0), "%999999"));
    cr_assert_eq(c->diag.nerrors, 2);
    c->diag.nerrors = 0;
    Settings *set = ts_settings(c, g, 0);
    WhyChain *wq = ex_why_trace(c, g, set, "wq"), *ffn = ex_why_trace(c, g, set, "ffn.w1");
    WhyChain *num = ex_why_trace(c, g, set, "%4");
    cr_assert_eq(pass_partition(c, g, set), 0);
    cr_assert(!strncmp(chain(c, g, wq), "why 'layers.0.wq' %", 19));
    cr_assert(!strncmp(chain(c, g, ffn), "why 'layers.0.ffn.w1' %", 23));
    /* params come first, in declaration order: tok_embed %2, then layer 0's */
    char *s = chain(c, g, num);
    cr_assert(!strncmp(s, "why 'layers.0.wq' %4 :", 22), "%%4 is: %.60s", s);
    fclose(quiet);
    ctx_free(c);
}
