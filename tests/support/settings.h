/* settings.h: a graph's train settings as the driver hands them to the passes
 * (pass_settings), for the tests that run passes themselves. Header-only. */
#ifndef TCC_TEST_SETTINGS_H
#define TCC_TEST_SETTINGS_H

#include "passes/passes.h"

/* g's settings in c's arena, the compile's choices 0 (unroll: as given);
 * NULL after reporting a bad train block. */
static inline Settings *ts_settings(Ctx *c, const Graph *g, int unroll)
{
    Settings *s = arena_alloc(c->arena, sizeof *s);
    if (pass_settings(c, g, s) != 0)
        return NULL;
    s->unroll = unroll;
    return s;
}

#endif
