/* parse_ctx.h: state shared by the lexer and the parser of one TDL source. */
#ifndef TCC_PARSE_CTX_H
#define TCC_PARSE_CTX_H

#include "ast.h"

typedef struct Parser {
    Ctx *c;
    const char *file; /* interned */
    int line, col;    /* position of the next byte */
    int depth;        /* open ( and [ : newlines inside are spaces */
    int at_eof;
    Ast *ast;
} Parser;

typedef struct TdlLoc {
    int first_line, first_column, last_line, last_column;
} TdlLoc;
void fe_advance(Parser *p, TdlLoc *loc, const char *text, int len);
void fe_lex_error(Parser *p, const TdlLoc *loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
const char *fe_intern(Parser *p, const char *text, int len);

#endif
