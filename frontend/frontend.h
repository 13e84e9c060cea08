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

/* Check and lower the AST to the forward-pass Graph, binding c->mesh_spec
 * ("8x4x2" or "dp=8,tp=4") and c->defines. NULL after errors. */
Graph *fe_lower(Ctx *c, Ast *ast);

/* fe_parse then fe_lower. */
Graph *fe_compile(Ctx *c, const char *path, const char *text, size_t len);

#endif
