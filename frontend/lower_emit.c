/* lower_emit.c: appends the ops of lowering to the forward Graph.
 * Reads the operands and attrs; writes an Op and its results, or an error
 * with a note per operand. Key idea: every result's dtype and shape come
 * from ir_infer, the one table of shape rules; an op that does not infer is
 * taken back out. */
#include "lower_impl.h"

enum { MAX_OPS = 100000 };

int fe_op_layer(Lower *L)
{
    if (L->layer == LAYER_NEXT)
        L->layer = L->next_layer++;
    return L->layer;
}

static void shape_notes(Lower *L, Value **args, int n)
{
    for (int i = 0; i < n; i++) {
        Value *v = args[i];
        if (v->name)
            fe_note(L, v->loc, "'%s' is %s", v->name, fe_type_str(L, v));
        else
            fe_note(L, v->loc, "operand %d is %s, computed here", i + 1, fe_type_str(L, v));
    }
}

/* Append op kind(args) with attrs and infer its result. On a shape or dtype
 * error, report it at loc with a note per operand and return NULL. */
Value *fe_emit(Lower *L, OpKind kind, Value **args, int n, Attr **attrs, int nattrs, Loc loc)
{
    if (L->g->ops.len >= MAX_OPS) {
        if (!L->too_big++)
            fe_err(L, loc, "the model has more than %d ops", MAX_OPS);
        return NULL;
    }
    Op *op = ir_op_new(L->g, kind, args, n, loc);
    op->layer = fe_op_layer(L);
    for (int i = 0; i < nattrs; i++)
        ir_op_set_attr(L->g, op, attrs[i]);
    DType dt;
    int rank;
    int64_t shape[IR_MAX_RANK];
    char msg[256];
    if (ir_infer(op, &dt, &rank, shape, msg, sizeof msg) != 0) {
        L->g->ops.len--;
        fe_err(L, loc, "in '%s': %s", ir_ops[kind].name, msg);
        shape_notes(L, args, n);
        return NULL;
    }
    Value *v = ir_op_result(L->g, op, dt, rank, shape);
    for (int i = 1; i < ir_ops[kind].nres; i++) /* topk's indices */
        if (ir_infer_result(op, i, &dt, &rank, shape, msg, sizeof msg) == 0)
            ir_op_result(L->g, op, dt, rank, shape);
        else
            BUG("'%s' has no result %d: %s", ir_ops[kind].name, i, msg);
    return v;
}

Value *fe_emit_constant(Lower *L, double x, DType dt, Loc loc)
{
    Attr *a = ir_attr_float(L->c->arena, "value", x);
    if (L->g->ops.len >= MAX_OPS)
        return fe_emit(L, OP_CONSTANT, NULL, 0, NULL, 0, loc);
    Op *op = ir_op_new(L->g, OP_CONSTANT, NULL, 0, loc);
    op->layer = fe_op_layer(L);
    ir_op_set_attr(L->g, op, a);
    return ir_op_result(L->g, op, dt, 0, NULL);
}
