/* parser.y: the TDL grammar (docs/language.md). Reads tokens from lexer.l,
 * writes an Ast in the arena. A syntax error is reported and the parser skips
 * to the end of the line, so one run reports every broken statement. */
%define api.pure full
%define api.prefix {tdl_}
%define parse.error detailed
%locations
%param {yyscan_t scanner}
%parse-param {Parser *p}

%code requires {
#include "frontend/parse_ctx.h"
#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif
#define TDL_LTYPE TdlLoc
#define TDL_LTYPE_IS_DECLARED 1
}

%code {
#include "lexer.h"
#include <string.h>

static void tdl_error(TdlLoc *loc, yyscan_t scanner, Parser *p, const char *msg);
static Loc L(Parser *p, TdlLoc l) { return (Loc){p->file, l.first_line, l.first_column}; }
static Expr *expr(Parser *p, ExprKind k, TdlLoc l)
{
    Expr *e = arena_alloc(p->c->arena, sizeof(Expr));
    e->kind = k;
    e->loc = L(p, l);
    return e;
}
static Expr *bin(Parser *p, int op, Expr *a, Expr *b, TdlLoc l)
{
    Expr *e = expr(p, E_BIN, l);
    e->op = op;
    e->lhs = a;
    e->rhs = b;
    return e;
}
static Stmt *stmt(Parser *p, StmtKind k, TdlLoc l)
{
    Stmt *s = arena_alloc(p->c->arena, sizeof(Stmt));
    s->kind = k;
    s->loc = L(p, l);
    return s;
}
#define A (p->c->arena)
}

%union {
    int64_t ival;
    double fval;
    const char *str;
    Expr *expr;
    Stmt *stmt;
    TypeAst *type;
    DimAst *dim;
}

%token <ival> INT "integer"
%token <fval> FLOAT "number"
%token <str> NAME "name" STRING "string"
%token NL "end of line"
%token MODEL "'model'" MESH "'mesh'" INPUT "'input'" PARAM "'param'" REPEAT "'repeat'"
%token AS "'as'" BLOCK "'block'" RETURN "'return'" TRAIN "'train'" OUTPUT "'output'"
%token IF "'if'" ELSE "'else'"
%token LE "'<='" GE "'>='" EQ "'=='" NE "'!='"

%type <expr> expr dexpr dterm dfactor primary arg args exprs
%type <stmt> stmt items body model_params axes block_params if_stmt
%type <type> type dims
%type <dim> dim

%nonassoc '<' '>' LE GE EQ NE
%left '+' '-'
%left '*' '/' '%' '@'
%precedence UMINUS

%%

program
    : items                     { p->ast->items.data = (Stmt **)$1->body.data;
                                  p->ast->items.len = $1->body.len;
                                  p->ast->items.cap = $1->body.cap; }
    ;

/* A list of statements, kept in the body of a holder Stmt. */
items
    : %empty                    { $$ = stmt(p, S_TRAIN, @$); }
    | items NL                  { $$ = $1; }
    | items stmt NL             { $$ = $1; VEC_PUSH(A, $$->body, $2); }
    | items error NL            { $$ = $1; yyerrok; }
    ;

body
    : '{' items '}'             { $$ = $2; }
    | '{' items stmt '}'        { $$ = $2; VEC_PUSH(A, $$->body, $3); }
    ;

stmt
    : MODEL NAME                { $$ = stmt(p, S_MODEL, @1); $$->name = $2; $$->name_loc = L(p, @2); }
    | MODEL NAME '(' ')'        { $$ = stmt(p, S_MODEL, @1); $$->name = $2; $$->name_loc = L(p, @2); }
    | MODEL NAME '(' model_params ')'
                                { $$ = $4; $$->kind = S_MODEL; $$->loc = L(p, @1);
                                  $$->name = $2; $$->name_loc = L(p, @2); }
    | MESH axes                 { $$ = $2; $$->loc = L(p, @1); }
    | INPUT NAME ':' type       { $$ = stmt(p, S_INPUT, @1); $$->name = $2; $$->name_loc = L(p, @2);
                                  $$->type = $4; }
    | PARAM NAME ':' type       { $$ = stmt(p, S_PARAM, @1); $$->name = $2; $$->name_loc = L(p, @2);
                                  $$->type = $4; }
    | PARAM NAME ':' type '=' expr
                                { $$ = stmt(p, S_PARAM, @1); $$->name = $2; $$->name_loc = L(p, @2);
                                  $$->type = $4; $$->value = $6; }
    | NAME '=' expr             { $$ = stmt(p, S_ASSIGN, @1); $$->name = $1; $$->name_loc = L(p, @1);
                                  $$->value = $3; }
    | NAME ':' type '=' expr    { $$ = stmt(p, S_ASSIGN, @1); $$->name = $1; $$->name_loc = L(p, @1);
                                  $$->type = $3; $$->value = $5; }
    | NAME ',' block_params '=' expr
                                { $$ = $3; $$->kind = S_ASSIGN; $$->loc = L(p, @1);
                                  $$->name = $1; $$->name_loc = L(p, @1); $$->value = $5; }
    | REPEAT expr body          { $$ = $3; $$->kind = S_REPEAT; $$->loc = L(p, @1); $$->value = $2; }
    | REPEAT expr AS NAME body  { $$ = $5; $$->kind = S_REPEAT; $$->loc = L(p, @1); $$->value = $2;
                                  $$->str = $4; $$->str_loc = L(p, @4); }
    | REPEAT expr AS NAME ',' NAME body
                                { $$ = $7; $$->kind = S_REPEAT; $$->loc = L(p, @1); $$->value = $2;
                                  $$->str = $4; $$->str_loc = L(p, @4);
                                  $$->index = $6; $$->index_loc = L(p, @6); }
    | BLOCK NAME '(' ')' body   { $$ = $5; $$->kind = S_BLOCK; $$->loc = L(p, @1);
                                  $$->name = $2; $$->name_loc = L(p, @2); }
    | BLOCK NAME '(' block_params ')' body
                                { $$ = $6; $$->kind = S_BLOCK; $$->loc = L(p, @1);
                                  $$->name = $2; $$->name_loc = L(p, @2);
                                  $$->params = $4->params; $$->param_locs = $4->param_locs; }
    | RETURN expr               { $$ = stmt(p, S_RETURN, @1); $$->value = $2; }
    | RETURN expr ',' exprs     { $$ = stmt(p, S_RETURN, @1); $$->value = $4; $$->value->loc = L(p, @2);
                                  VEC_PUSH(A, $4->args, NULL);
                                  memmove($4->args.data + 1, $4->args.data,
                                          sizeof(Expr *) * (size_t)($4->args.len - 1));
                                  $4->args.data[0] = $2; }
    | TRAIN body                { $$ = $2; $$->kind = S_TRAIN; $$->loc = L(p, @1); }
    | OUTPUT NAME               { $$ = stmt(p, S_OUTPUT, @1); $$->name = $2; $$->name_loc = L(p, @2); }
    | if_stmt
    ;

/* if COND { ... } [else { ... } | else if ...]: the branch chosen when lowering. */
if_stmt
    : IF expr body              { $$ = $3; $$->kind = S_IF; $$->loc = L(p, @1); $$->value = $2; }
    | IF expr body ELSE body    { $$ = $3; $$->kind = S_IF; $$->loc = L(p, @1); $$->value = $2;
                                  $$->orelse = $5; }
    | IF expr body ELSE if_stmt { $$ = $3; $$->kind = S_IF; $$->loc = L(p, @1); $$->value = $2;
                                  $$->orelse = $5; }
    ;

model_params
    : NAME '=' expr             { $$ = stmt(p, S_MODEL, @1);
                                  Stmt *s = stmt(p, S_ASSIGN, @1); s->name = $1; s->name_loc = L(p, @1);
                                  s->value = $3; VEC_PUSH(A, $$->body, s); }
    | model_params ',' NAME '=' expr
                                { $$ = $1;
                                  Stmt *s = stmt(p, S_ASSIGN, @3); s->name = $3; s->name_loc = L(p, @3);
                                  s->value = $5; VEC_PUSH(A, $$->body, s); }
    ;

axes
    : NAME ':' NAME             { $$ = stmt(p, S_MESH, @1);
                                  Stmt *s = stmt(p, S_AXIS, @1); s->name = $1; s->name_loc = L(p, @1);
                                  s->str = $3; s->str_loc = L(p, @3); VEC_PUSH(A, $$->body, s); }
    | axes ',' NAME ':' NAME    { $$ = $1;
                                  Stmt *s = stmt(p, S_AXIS, @3); s->name = $3; s->name_loc = L(p, @3);
                                  s->str = $5; s->str_loc = L(p, @5); VEC_PUSH(A, $$->body, s); }
    ;

block_params
    : NAME                      { $$ = stmt(p, S_BLOCK, @1); VEC_PUSH(A, $$->params, $1);
                                  VEC_PUSH(A, $$->param_locs, L(p, @1)); }
    | block_params ',' NAME     { $$ = $1; VEC_PUSH(A, $$->params, $3);
                                  VEC_PUSH(A, $$->param_locs, L(p, @3)); }
    ;

type
    : NAME '[' ']'              { $$ = arena_alloc(A, sizeof(TypeAst)); $$->dtype = $1;
                                  $$->loc = L(p, @1); $$->dtype_loc = L(p, @1); }
    | NAME '[' dims ']'         { $$ = $3; $$->dtype = $1; $$->loc = L(p, @1); $$->dtype_loc = L(p, @1); }
    ;

dims
    : dim                       { $$ = arena_alloc(A, sizeof(TypeAst)); VEC_PUSH(A, $$->dims, $1); }
    | dims ',' dim              { $$ = $1; VEC_PUSH(A, $$->dims, $3); }
    ;

dim
    : dexpr                     { $$ = arena_alloc(A, sizeof(DimAst)); $$->size = $1; }
    | dexpr '@' NAME            { $$ = arena_alloc(A, sizeof(DimAst)); $$->size = $1;
                                  VEC_PUSH(A, $$->axes, $3); VEC_PUSH(A, $$->axis_locs, L(p, @3)); }
    | dexpr '@' '(' block_params ')'
                                { $$ = arena_alloc(A, sizeof(DimAst)); $$->size = $1;
                                  $$->axes.data = $4->params.data; $$->axes.len = $4->params.len;
                                  $$->axes.cap = $4->params.cap;
                                  $$->axis_locs.data = $4->param_locs.data;
                                  $$->axis_locs.len = $4->param_locs.len;
                                  $$->axis_locs.cap = $4->param_locs.cap; }
    ;

/* Dimension sizes: integer arithmetic without '@', which introduces the axes. */
dexpr
    : dexpr '+' dterm           { $$ = bin(p, '+', $1, $3, @2); }
    | dexpr '-' dterm           { $$ = bin(p, '-', $1, $3, @2); }
    | dterm
    ;

dterm
    : dterm '*' dfactor         { $$ = bin(p, '*', $1, $3, @2); }
    | dterm '/' dfactor         { $$ = bin(p, '/', $1, $3, @2); }
    | dterm '%' dfactor         { $$ = bin(p, '%', $1, $3, @2); }
    | dfactor
    ;

dfactor
    : '-' dfactor               { $$ = expr(p, E_NEG, @1); $$->lhs = $2; }
    | primary
    ;

expr
    : expr '+' expr             { $$ = bin(p, '+', $1, $3, @2); }
    | expr '-' expr             { $$ = bin(p, '-', $1, $3, @2); }
    | expr '*' expr             { $$ = bin(p, '*', $1, $3, @2); }
    | expr '/' expr             { $$ = bin(p, '/', $1, $3, @2); }
    | expr '%' expr             { $$ = bin(p, '%', $1, $3, @2); }
    | expr '@' expr             { $$ = bin(p, '@', $1, $3, @2); }
    | expr '<' expr             { $$ = bin(p, '<', $1, $3, @2); }
    | expr '>' expr             { $$ = bin(p, '>', $1, $3, @2); }
    | expr LE expr              { $$ = bin(p, OPC_LE, $1, $3, @2); }
    | expr GE expr              { $$ = bin(p, OPC_GE, $1, $3, @2); }
    | expr EQ expr              { $$ = bin(p, OPC_EQ, $1, $3, @2); }
    | expr NE expr              { $$ = bin(p, OPC_NE, $1, $3, @2); }
    | '-' expr %prec UMINUS     { $$ = expr(p, E_NEG, @1); $$->lhs = $2; }
    | primary
    ;

primary
    : INT                       { $$ = expr(p, E_INT, @1); $$->ival = $1; }
    | FLOAT                     { $$ = expr(p, E_FLOAT, @1); $$->fval = $1; }
    | STRING                    { $$ = expr(p, E_STR, @1); $$->name = $1; }
    | NAME                      { $$ = expr(p, E_NAME, @1); $$->name = $1; }
    | NAME '(' ')'              { $$ = expr(p, E_CALL, @1); $$->name = $1; }
    | NAME '(' args ')'         { $$ = $3; $$->kind = E_CALL; $$->loc = L(p, @1); $$->name = $1; }
    | '(' expr ')'              { $$ = $2; }
    | '(' expr ',' exprs ')'    { $$ = $4; $$->loc = L(p, @1);
                                  VEC_PUSH(A, $$->args, NULL);
                                  memmove($$->args.data + 1, $$->args.data,
                                          sizeof(Expr *) * (size_t)($$->args.len - 1));
                                  $$->args.data[0] = $2; }
    | '[' ']'                   { $$ = expr(p, E_LIST, @1); }
    | '[' exprs ']'             { $$ = $2; $$->loc = L(p, @1); }
    ;

exprs
    : expr                      { $$ = expr(p, E_LIST, @1); VEC_PUSH(A, $$->args, $1); }
    | exprs ',' expr            { $$ = $1; VEC_PUSH(A, $$->args, $3); }
    ;

args
    : arg                       { $$ = expr(p, E_CALL, @1); VEC_PUSH(A, $$->args, $1); }
    | args ',' arg              { $$ = $1; VEC_PUSH(A, $$->args, $3); }
    ;

arg
    : expr
    | NAME '=' expr             { $$ = expr(p, E_KWARG, @1); $$->name = $1; $$->lhs = $3; }
    ;

%%

static void tdl_error(TdlLoc *loc, yyscan_t scanner, Parser *p, const char *msg)
{
    (void)scanner;
    const char *m = msg;
    if (strncmp(m, "syntax error, ", 14) == 0)
        m += 14;
    diag_error(&p->c->diag, L(p, *loc), "syntax error: %s", m);
}

void fe_advance(Parser *p, TdlLoc *loc, const char *text, int len)
{
    loc->first_line = p->line;
    loc->first_column = p->col;
    for (int i = 0; i < len; i++) {
        if (text[i] == '\n') {
            p->line++;
            p->col = 1;
        } else {
            p->col++;
        }
    }
    loc->last_line = p->line;
    loc->last_column = p->col;
}

void fe_lex_error(Parser *p, const TdlLoc *loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(&p->c->diag, SEV_ERROR, L(p, *loc), 1, fmt, ap);
    va_end(ap);
}

const char *fe_intern(Parser *p, const char *text, int len)
{
    return intern_n(p->c->strings, text, (size_t)len);
}

Ast *fe_parse(Ctx *c, const char *path, const char *text, size_t len)
{
    Parser p = {c, intern(c->strings, path), 1, 1, 0, 0, NULL};
    p.ast = arena_alloc(c->arena, sizeof(Ast));
    p.ast->file = p.file;
    diag_add_source(&c->diag, p.file, text, len);
    int before = c->diag.nerrors;
    yyscan_t scanner;
    if (tdl_lex_init_extra(&p, &scanner) != 0)
        BUG("cannot initialise the lexer");
    YY_BUFFER_STATE buf = tdl__scan_bytes(text, (int)len, scanner);
    int rc = tdl_parse(scanner, &p);
    tdl__delete_buffer(buf, scanner);
    tdl_lex_destroy(scanner);
    if (rc != 0 && c->diag.nerrors == before) {
        Loc end = {p.file, p.line, p.col};
        diag_error(&c->diag, end, "cannot parse this file");
    }
    return c->diag.nerrors == before ? p.ast : NULL;
}
