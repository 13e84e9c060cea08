/* lower_impl.h: what the files of lowering (lower*.c) share, private to the
 * frontend: the walk's state (Lower), the values expressions evaluate to,
 * scopes of names, the op table's specs, and each file's entry points.
 * The files stand in layers, each needing only those above it in this list:
 *   lower_scope.c  diagnostics and scopes of names
 *   lower_emit.c   appending ops to the Graph, shapes inferred
 *   lower_ops.c    the ops a call may name, and those lowered specially
 *   lower_expr.c   expressions and calls
 *   lower_decl.c   declared types: inputs, parameters, annotated values
 *   lower_train.c  the train block
 *   lower_model.c  the model header, the mesh declaration and --mesh
 *   lower.c        statements, blocks, repeats: the walk (fe_lower)
 * A block call in an expression lowers the block's statements: expressions
 * reach lower.c through Lower.call_block, which fe_lower sets. */
#ifndef TCC_LOWER_IMPL_H
#define TCC_LOWER_IMPL_H

#include "ast.h"
#include "frontend.h"

typedef enum { V_ERR, V_INT, V_FLOAT, V_BOOL, V_STR, V_TENSOR, V_LIST } VKind;

typedef struct Val {
    VKind k;
    int64_t i;
    double f;
    const char *s;
    Value *t;
    struct Val *items;
    int n;
} Val;

typedef enum { B_VALUE, B_MODEL, B_PARAM, B_INPUT, B_INDEX } BindKind;

typedef struct Binding {
    const char *name;
    BindKind kind;
    Val val;
    Loc loc;
} Binding;

typedef struct Scope {
    struct Scope *parent;
    VEC(Binding) b;
    int boundary; /* assignments do not look past a boundary scope */
} Scope;

typedef struct Lower {
    Ctx *c;
    FeOptions fo;     /* --mesh, the repeat limit */
    Graph *g;
    Ast *ast;
    Scope *root;      /* model parameters */
    Scope *scope;
    int64_t unrolled;   /* repeat bodies lowered so far, nested ones included */
    const char *prefix; /* parameter name prefix, "" or "h.3." */
    int layer;          /* of the ops being lowered: -1 outside repeats, or LAYER_NEXT */
    int next_layer;     /* the number the next layer takes: layers go in program order */
    int depth;        /* block call depth */
    int too_big;
    int dropouts; /* dropout calls lowered so far: each its own random stream */
    Loc model_loc;
    VEC(Stmt *) blocks;
    VEC(const char *) param_names; /* every parameter's full name */
    VEC(Loc) param_locs;
    /* blk(args) in an expression: lowers the block's body (lower.c) */
    Val (*call_block)(struct Lower *L, Stmt *blk, Expr *e);
} Lower;

/* A region of a repeat copy (the copy's start, or its rest after a nested
 * repeat) is a new layer, numbered when it makes its first op: layers are in
 * program order (the pipeline cuts them in that order), and a region with no
 * op (an outer copy that only holds the inner repeat) takes no number. */
enum { LAYER_NEXT = -2 };

static const Val ERRV = {V_ERR, 0, 0, NULL, NULL, NULL, 0};

/* ---- values ---- */

static inline Val vint(int64_t i) { return (Val){V_INT, i, 0, NULL, NULL, NULL, 0}; }
static inline Val vfloat(double f) { return (Val){V_FLOAT, 0, f, NULL, NULL, NULL, 0}; }
static inline Val vtensor(Value *t) { return t ? (Val){V_TENSOR, 0, 0, NULL, t, NULL, 0} : ERRV; }
static inline int is_num(Val v) { return v.k == V_INT || v.k == V_FLOAT; }
static inline double num(Val v) { return v.k == V_INT ? (double)v.i : v.f; }

/* ---- the op table: the tensor ops a call may name ---- */

typedef enum { K_INT, K_FLOAT, K_BOOL, K_INTS, K_DTYPE, K_TENSOR } KwKind; /* K_TENSOR: an extra
                                                                       operand, after the others */

typedef struct KwSpec {
    const char *name;
    KwKind kind;
} KwSpec;

enum { OP_MAX_KW = 9 };

typedef struct OpSpec {
    const char *name;
    OpKind op;
    int min_t, max_t; /* leading tensor operands */
    KwSpec kw[OP_MAX_KW]; /* further positional arguments fill these in order */
} OpSpec;

/* ---- lower_scope.c: diagnostics and scopes ---- */

/* An error or a note at loc, to the context's diagnostics. */
void fe_err(Lower *L, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);
void fe_note(Lower *L, Loc loc, const char *fmt, ...) PRINTF_LIKE(3, 4);

/* v's type as written in TDL ("f32[8, 16]"), in the arena. */
const char *fe_type_str(Lower *L, const Value *v);

/* The kind of a value with its article: "an integer", "a tensor". */
const char *fe_kind_name(VKind k);

/* A new empty scope under parent; assignments do not look past a boundary one. */
Scope *fe_scope_new(Lower *L, Scope *parent, int boundary);

/* The binding of name in s itself, or NULL. */
Binding *fe_scope_find_local(Scope *s, const char *name);

/* The binding of name in the current scope or an enclosing one, or NULL. */
Binding *fe_lookup(Lower *L, const char *name);

/* 1 with an error when name starts with a digit (not a name), else 0. */
int fe_digit_led(Lower *L, const char *name, Loc loc);

/* Bind name to v in s (an error first when name is digit-led). */
void fe_bind(Lower *L, Scope *s, const char *name, BindKind kind, Val v, Loc loc);

/* 0 when name may be declared in the current scope; -1 with an error when it
 * is there already or is a model parameter. */
int fe_check_fresh(Lower *L, const char *name, Loc loc);

/* ---- lower_emit.c: ops ---- */

/* The layer of the next op, numbering a new one at a LAYER_NEXT region. */
int fe_op_layer(Lower *L);

/* Append op kind(args) with attrs and infer its result. On a shape or dtype
 * error, report it at loc with a note per operand and return NULL. */
Value *fe_emit(Lower *L, OpKind kind, Value **args, int n, Attr **attrs, int nattrs, Loc loc);

/* A scalar constant x of dtype dt (NULL past the op limit). */
Value *fe_emit_constant(Lower *L, double x, DType dt, Loc loc);

/* ---- lower_ops.c: the op table and the ops lowered specially ---- */

/* The spec of the op a call names, or NULL. */
const OpSpec *fe_find_spec(const char *name);

/* s's keyword argument name, or NULL. */
const KwSpec *fe_find_kw(const OpSpec *s, const char *name);

/* s's keyword names for a message: "'dim', 'keepdim'" ("" when none). */
void fe_kw_names(const OpSpec *s, char *buf, size_t n);

/* attention(qkv, ...): t[0], the fused operand, split into q, k, v (t[0..2])
 * by the heads and kv_heads of attrs; -1 after an error. */
int fe_split_qkv(Lower *L, Value **t, Attr **attrs, int nattrs, Loc loc);

/* scatter(x, index, src) of t[0..2]: x + scatter_add(index, src). */
Val fe_call_scatter(Lower *L, Value **t, Loc loc);

/* dropout(x, p) with p among attrs (na of them; room for one more). */
Val fe_call_dropout(Lower *L, Value *x, Attr **attrs, int na, Loc loc);

/* ---- lower_expr.c: expressions ---- */

/* The value of e: numbers fold, tensor expressions emit ops, calls expand.
 * ERRV after an error (reported), which silences follow-on errors. */
Val fe_eval(Lower *L, Expr *e);

/* An integer expression (shape, count); -1 with an error when it is not one. */
int fe_eval_int(Lower *L, Expr *e, const char *what, int64_t *out);

/* The block named name, declared so far, or NULL. */
Stmt *fe_find_block(Lower *L, const char *name);

/* ---- lower_decl.c: declarations ---- */

/* input name : type, bound in the current scope (top level). */
void fe_lower_input(Lower *L, Stmt *s);

/* param name : type [= init], named with the current prefix. */
void fe_lower_param(Lower *L, Stmt *s);

/* x : type = v: v checked against the type, given its sharding; ERRV after errors. */
Val fe_annotate(Lower *L, Stmt *s, Val v);

/* ---- lower_train.c ---- */

/* train { ... }: the settings checked and kept in the Graph's train Attrs. */
void fe_lower_train(Lower *L, Stmt *s);

/* ---- lower_model.c: model header and mesh ---- */

/* model NAME(params): the parameters bound in the root scope (-D applied). */
void fe_lower_model(Lower *L, Stmt *s);

/* An error for each -D that names no model parameter (model may be NULL). */
void fe_check_defines(Lower *L, Stmt *model);

/* mesh { axis: role ... }: the Graph's mesh axes, each of size 1. */
void fe_lower_mesh(Lower *L, Stmt *s);

/* --mesh (fo.mesh): the axes' sizes, and their order when by name. */
void fe_bind_mesh(Lower *L);

#endif
