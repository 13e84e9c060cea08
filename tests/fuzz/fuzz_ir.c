/* fuzz_ir.c: libFuzzer harness for the IR text parser. Reads arbitrary bytes
 * as an IR file (not NUL-terminated). The parser must reject bad input with
 * diagnostics, never crash or leak; and a graph that parses and verifies must
 * print, parse back and print again byte for byte. */
#include "ir/ir.h"

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
    fprintf(stderr, "fuzz_ir: %s\n", what);
    if (first)
        fprintf(stderr, "---- printed ----\n%s\n", first);
    if (second)
        fprintf(stderr, "---- reprinted ----\n%s\n", second);
    fflush(stderr);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Ctx *c = ctx_new(sink);
    Graph *g = ir_parse(c, "fuzz.tir", (const char *)data, size);
    if (g && ir_verify(c, g) == 0) {
        char *first = ir_print_string(c->arena, g);
        c->diag.out = stderr; /* from here on, any diagnostic is a bug */
        Graph *back = ir_parse(c, "roundtrip.tir", first, strlen(first));
        if (!back)
            fail("the printed form of a valid graph does not parse", first, NULL);
        char *second = ir_print_string(c->arena, back);
        if (strcmp(first, second) != 0)
            fail("print -> parse -> print is not byte-identical", first, second);
    }
    ctx_free(c);
    return 0;
}
