/* fuzz_tdl.c: libFuzzer harness for the frontend and the passes. Reads
 * arbitrary bytes as a TDL source (not NUL-terminated, as a file read would
 * not be either), half of the inputs with --mesh 2x2x2 bound (odd first byte).
 * Any graph the frontend returns must pass the verifier and survive print ->
 * parse -> print byte for byte; then every pass runs on it (they may refuse
 * with a diagnostic) and each result must verify again, and a small one must
 * become a plan. Otherwise the harness aborts so libFuzzer keeps the input. */
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static FILE *sink; /* diagnostics of well-handled inputs go nowhere */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    sink = fopen("/dev/null", "w");
    if (!sink)
        abort();
    return 0;
}

static void fail(const char *what, const char *first, const char *second)
{
    fprintf(stderr, "fuzz_tdl: %s\n", what);
    if (first)
        fprintf(stderr, "---- printed ----\n%s\n", first);
    if (second)
        fprintf(stderr, "---- reprinted ----\n%s\n", second);
    fflush(stderr);
    abort();
}

/* A graph from the frontend must verify and round-trip through the IR text. */
static void check_graph(Ctx *c, const Graph *g)
{
    c->diag.out = stderr; /* from here on, any diagnostic is a bug */
    if (ir_verify(c, g) != 0)
        fail("a graph from the frontend does not verify", NULL, NULL);
    char *first = ir_print_string(c->arena, g);
    Graph *back = ir_parse(c, "roundtrip.tir", first, strlen(first));
    if (!back)
        fail("the printed IR of a frontend graph does not parse", first, NULL);
    char *second = ir_print_string(c->arena, back);
    if (strcmp(first, second) != 0)
        fail("print -> parse -> print is not byte-identical", first, second);
}

/* The passes on a verified graph: a refusal is fine, an invalid result is not. */
static void check_passes(Ctx *c, Graph *g)
{
    if (g->ops.len > 300) /* keep each input fast: big models are the samples' job */
        return;
    Settings s;
    c->diag.out = sink;
    if (pass_settings(c, g, &s) != 0)
        return;
    for (const Pass *p = pass_table; p->name; p++) {
        c->diag.out = sink;
        if (p->run(c, g, &s) != 0)
            return;
        c->diag.out = stderr;
        if (ir_verify(c, g) != 0)
            fail(p->name, "the graph does not verify after this pass", NULL);
        if (g->ops.len > 3000)
            return;
    }
    Plan plan;
    c->diag.out = sink;
    (void)cg_build_plan(c, g, &s.train, 0, &plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Ctx *c = ctx_new(sink);
    FeOptions fo = {.mesh = size > 0 && (data[0] & 1) ? "2x2x2" : NULL};
    Graph *g = fe_compile(c, "fuzz.tdl", (const char *)data, size, &fo);
    if (g) {
        check_graph(c, g);
        check_passes(c, g);
    }
    ctx_free(c);
    return 0;
}
