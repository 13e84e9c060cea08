/* frontend.h: TDL source -> forward Graph. Lexing (flex), parsing (bison) into
 * an AST, then checking and lowering in one walk that evaluates model
 * parameters, expands blocks and repeats, binds the mesh, infers shapes and
 * attaches annotated shardings. All errors go to the context's diagnostics. */
#ifndef TCC_FRONTEND_H
#define TCC_FRONTEND_H

#include "../ir/ir.h"

typedef struct Ast Ast;

/* Parse one TDL source (registered with the diagnostics sink). Returns the AST,
 * or NULL after syntax errors (all of them reported, the parser recovers). */
Ast *fe_parse(Ctx *c, const char *path, const char *text, size_t len);

/* What the command line adds to a model besides its -D defines (c->defines). */
typedef struct FeOptions {
    const char *mesh; /* --mesh: "8x4x2" or "dp=8,tp=4"; NULL: the model's own */
    int repeat_limit; /* the planner's profile: every repeat lowers at most this many
                         iterations (0: all) */
} FeOptions;

/* Check and lower the AST to the forward-pass Graph, binding fo's mesh and
 * c->defines (fo NULL: neither mesh nor limit). NULL after errors. */
Graph *fe_lower(Ctx *c, Ast *ast, const FeOptions *fo);

/* fe_parse then fe_lower. */
Graph *fe_compile(Ctx *c, const char *path, const char *text, size_t len, const FeOptions *fo);

#endif
