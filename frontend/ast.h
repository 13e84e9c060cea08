/* ast.h: the TDL syntax tree, private to the frontend. The parser builds it in
 * the arena; lowering (lower.c and the files lower_impl.h lists) walks it
 * once. Names are interned strings. */
#ifndef TCC_AST_H
#define TCC_AST_H

#include "frontend.h"

typedef enum {
    E_INT,   /* ival */
    E_FLOAT, /* fval */
    E_NAME,  /* name (may be dotted: ln1.g) */
    E_STR,   /* name holds the text */
    E_BIN,   /* op is one of + - * / % @ < > or an OPC_ below; lhs, rhs */
    E_NEG,   /* lhs */
    E_CALL,  /* name(args) ; a keyword arg is an E_KWARG */
    E_KWARG, /* name = lhs */
    E_LIST,  /* [args] or (a, b) */
} ExprKind;

/* E_BIN's op for the operators of two characters (the others are their character). */
enum { OPC_LE = 256, OPC_GE, OPC_EQ, OPC_NE };

typedef struct Expr {
    ExprKind kind;
    Loc loc;
    int op;
    int64_t ival;
    double fval;
    const char *name;
    struct Expr *lhs, *rhs;
    VEC(struct Expr *) args;
} Expr;

/* One dimension of a type: its size expression and the axes it is split over. */
typedef struct DimAst {
    Expr *size;
    VEC(const char *) axes;
    VEC(Loc) axis_locs;
} DimAst;

typedef struct TypeAst {
    const char *dtype;
    Loc loc, dtype_loc;
    VEC(DimAst *) dims;
} TypeAst;

typedef enum {
    S_MODEL,   /* model NAME(params): params are S_ASSIGN with int exprs */
    S_MESH,    /* mesh axes: each an S_AXIS */
    S_AXIS,    /* name: role (role in str) */
    S_INPUT,   /* input name : type */
    S_PARAM,   /* param name : type [= init] */
    S_ASSIGN,  /* name [: type] = value */
    S_REPEAT,  /* repeat value [as name] { body } */
    S_BLOCK,   /* block name(params) { body } : params in `params` */
    S_RETURN,  /* return value */
    S_TRAIN,   /* train { S_ASSIGN* } */
    S_OUTPUT,  /* output name */
    S_IF,      /* if value { body } [else orelse]: orelse a body holder or an S_IF */
} StmtKind;

typedef struct Stmt {
    StmtKind kind;
    Loc loc;
    const char *name;
    Loc name_loc;
    const char *str; /* S_AXIS: the role; S_REPEAT: the scope name */
    Loc str_loc;
    const char *index; /* S_REPEAT: the name of the copy's number, or NULL */
    Loc index_loc;
    TypeAst *type;
    Expr *value;
    VEC(struct Stmt *) body;   /* model params, mesh axes, repeat/block/train bodies */
    VEC(const char *) params;  /* S_BLOCK formal parameters; S_ASSIGN `a, b, c = e`: b and c
                                  (a is `name`) */
    VEC(Loc) param_locs;
    struct Stmt *orelse;       /* S_IF: the else branch, or NULL */
} Stmt;

struct Ast {
    const char *file;
    VEC(Stmt *) items;
};

#endif
