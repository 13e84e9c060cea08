/* lower_train.c: the train block, kept as Attrs on the Graph and acted on
 * by later passes. Reads the block's settings; writes Graph.train.
 * Key idea: a setting's value is kept as written (a name, a call, a list or a
 * number), checked by ir_train_set one at a time and by ir_train_finish
 * all together. */
#include "lower_impl.h"

#include <string.h>

/* ---- the train block: kept as Attrs, acted on by later passes ---- */

static const char *const train_keys[] = {
    "optimizer", "lr", "lr_schedule", "grad_clip", "microbatches", "recompute", "precision",
    "schedule", "virtual_stages", "zero", "sequence_parallel", "stage_starts", "steps", "seed",
    "weight_decay", NULL};

static Attr *train_attr(Lower *L, const char *key, Expr *e)
{
    Arena *a = L->c->arena;
    switch (e->kind) {
    case E_NAME:
        if (!fe_lookup(L, e->name) && strcmp(e->name, "true") && strcmp(e->name, "false"))
            return ir_attr_str(a, key, e->name);
        break;
    case E_STR: return ir_attr_str(a, key, e->name);
    case E_CALL:
    case E_LIST: {
        Attr **items = arena_alloc(a, sizeof(Attr *) * (size_t)(e->args.len + 1));
        for (int i = 0; i < e->args.len; i++) {
            Expr *x = e->args.data[i];
            items[i] = x->kind == E_KWARG ? train_attr(L, x->name, x->lhs) : train_attr(L, NULL, x);
            if (!items[i])
                return NULL;
        }
        return e->kind == E_CALL ? ir_attr_call(a, key, e->name, items, e->args.len)
                                 : ir_attr_list(a, key, items, e->args.len);
    }
    default: break;
    }
    Val v = fe_eval(L, e);
    switch (v.k) {
    case V_INT: return ir_attr_int(a, key, v.i);
    case V_FLOAT: return ir_attr_float(a, key, v.f);
    case V_BOOL: return ir_attr_bool(a, key, (int)v.i);
    case V_ERR: return NULL;
    default: fe_err(L, e->loc, "a training setting cannot be %s", fe_kind_name(v.k)); return NULL;
    }
}

void fe_lower_train(Lower *L, Stmt *s)
{
    if (L->g->train.len) {
        fe_err(L, s->loc, "more than one 'train' block");
        return;
    }
    Scope *saved = L->scope;
    L->scope = L->root; /* settings see model parameters, not tensors */
    TrainConfig all; /* every setting, for the checks across them */
    ir_train_defaults(&all);
    for (int i = 0; i < s->body.len; i++) {
        Stmt *t = s->body.data[i];
        if (t->kind != S_ASSIGN || t->type) {
            fe_err(L, t->loc, "only 'name = value' settings are allowed in 'train'");
            continue;
        }
        int known = 0;
        for (int k = 0; train_keys[k]; k++)
            known |= strcmp(train_keys[k], t->name) == 0;
        if (!known) { /* before evaluating: the value may not even make sense */
            fe_err(L, t->name_loc, "unknown training setting '%s'", t->name);
            fe_note(L, LOC_NONE, "the settings are optimizer, lr, lr_schedule, grad_clip, "
                    "microbatches, recompute, precision, schedule, virtual_stages, zero, steps, "
                    "seed, weight_decay");
            continue;
        }
        for (int k = 0; k < L->g->train.len; k++)
            if (strcmp(L->g->train.data[k]->key, t->name) == 0)
                fe_err(L, t->name_loc, "training setting '%s' given twice", t->name);
        Attr *a = train_attr(L, t->name, t->value);
        TrainConfig tc;
        char msg[256];
        ir_train_defaults(&tc);
        if (a && ir_train_set(&tc, a, msg, sizeof msg) != 0) {
            fe_err(L, t->value->loc, "%s", msg);
            a = NULL;
        }
        if (a) {
            VEC_PUSH(L->c->arena, L->g->train, a);
            ir_train_set(&all, a, msg, sizeof msg);
        }
    }
    L->scope = saved;
    char msg[256];
    if (L->c->diag.nerrors == 0 && ir_train_finish(&all, msg, sizeof msg) != 0)
        fe_err(L, s->loc, "%s", msg);
}
