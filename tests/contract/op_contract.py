#!/usr/bin/env python3
"""op_contract.py TCC [--ops a,b] [--seed N] [--keep DIR]: the sharding
contract per op, not per model (issue 38).

For every op of ir/ops.def it writes copies of that op into a TDL model:
each float operand a parameter (so the op's gradient op runs too), each
integer operand an input, on random shapes (every dim even, 2 to 6, from
--seed). There is one copy of the op for every split of one operand on one
of its dims over a mesh axis `tp` of 2, the other operands whole, and one
copy for every float operand given as a partial sum over `tp` (a matrix
product whose contracted dim is split). The loss adds up each result times a
random input of its shape. `TCC --verify` on --mesh 2 then compares the
mesh with one device in float64: each step's loss, step 1's gradients, the
parameters and optimizer state after 3 steps. A wrong rule anywhere (a
split kept on a dim the op reduces over, a permutation read backwards)
shows as a difference, and the search's first diverging value names the
op's copy by its TDL line. Ops share a model (GROUPS; attention has its
own): the time is mostly compiling their kernels. A model that fails blames
the op of that line and leaves the others in it not judged.

Each op of the table is one of: a recipe here (a user's op), the gradient op
of a recipe (checked to appear in that model after autodiff), an op of the
optimizer (every model trains with one, its state split as its parameter),
or one made by a pass after sharding (the collectives the contract checks).
An op in none of these fails the run: a new op needs a recipe.

Prints a line per op, 'OP: verified (N splits)' or 'OP: FAILED ...', and
ends with 'N passed, N failed'; exits 1 when any op fails."""
import argparse
import concurrent.futures
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Ops no user writes: made after sharding by the partition pass or codegen
# (what the contract checks, not a rule), or by the microbatch pass (the
# whole-model contract tests run microbatches).
MADE_BY_PASSES = {
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "shard_slice",
    "cross_entropy_shard", "cross_entropy_grad_shard", "axis_offset", "microbatch_sum",
}
# Sources and the optimizer: in every model below (sgd with momentum or
# adamw, clipping on), on parameters split every way the recipes split them.
IN_EVERY_MODEL = {"input", "param", "constant", "step", "state", "lr", "clip_scale", "sgd",
                  "adamw", "update"}
# The gradient op each recipe's model must contain after autodiff.
GRAD_OF = {
    "gelu_grad": "gelu", "silu_grad": "silu", "relu_grad": "relu",
    "softmax_grad": "softmax", "max_grad": "max", "layernorm_grad": "layernorm",
    "rmsnorm_grad": "rmsnorm", "embed_grad": "embed", "gather_grad": "gather",
    "attention_grad": "attention", "cross_entropy_grad": "cross_entropy",
    "scatter_add": "scatter", "sum_to": "add", "pad": "slice",
}


class Gen:
    """Random even sizes, drawn once per op so every copy shares them."""

    def __init__(self, rng):
        self.rng = rng

    def dim(self):
        return self.rng.choice([2, 4, 6])


def P(shape, kind="f"):
    """An operand: float param ('f'), positive float param ('pos': its exp),
    or integer input ('i', its range set by the op that reads it)."""
    return (tuple(shape), kind)


def recipes(g):
    """op name -> list of variants (operands, expression over {0}, {1}, ...,
    the result shapes). One call: the shapes are drawn now."""
    a, b, c = g.dim(), g.dim(), g.dim()
    r = {}
    x3 = [P([a, b, c])]
    for op in ["tanh", "sigmoid", "relu", "gelu", "silu", "erf", "exp"]:
        r[op] = [(x3, op + "({0})", [[a, b, c]])]
    r["neg"] = [(x3, "-{0}", [[a, b, c]])]
    r["stop_gradient"] = [(x3, "stop_gradient({0}) * {0}", [[a, b, c]])]
    for op in ["log", "sqrt", "rsqrt"]:
        r[op] = [([P([a, b, c], "pos")], op + "({0})", [[a, b, c]])]
    r["cast"] = [(x3, "cast(cast({0}, f32), f64)", [[a, b, c]])]
    r["abs"] = [(x3, "abs({0})", [[a, b, c]])]
    r["floor"] = [(x3, "floor({0} * 3.0) * {0}", [[a, b, c]])]
    # positions against a split operand: arange itself is never split
    r["arange"] = [([P([a, c])], "{0} * arange(%d, dtype = f64)" % c, [[a, c]])]
    r["dropout"] = [(x3, "dropout({0}, 0.25)", [[a, b, c]])]
    two = [P([a, b, c]), P([a, b, c])]
    r["add"] = [(two, "{0} + {1}", [[a, b, c]]), ([P([a, b, c]), P([c])], "{0} + {1}", [[a, b, c]])]
    r["sub"] = [(two, "{0} - {1}", [[a, b, c]])]
    r["mul"] = [(two, "{0} * {1}", [[a, b, c]]),
                ([P([a, b, c]), P([a, 1, c])], "{0} * {1}", [[a, b, c]])]
    r["div"] = [([P([a, b, c]), P([a, b, c], "pos")], "{0} / {1}", [[a, b, c]])]
    for op, sym in [("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")]:
        r[op] = [(two, "({0} %s {1}) * {0}" % sym, [[a, b, c]])]
    r["eq"] = [(x3, "({0} == relu({0})) * {0}", [[a, b, c]])]
    r["ne"] = [(x3, "({0} != relu({0})) * {0}", [[a, b, c]])]
    r["where"] = [([P([a, b, c]), P([a, b, c]), P([a, b, c])],
                   "where({0} > 0.0, {1}, {2})", [[a, b, c]])]
    m, k, n = g.dim(), g.dim(), g.dim()
    r["matmul"] = [([P([m, k]), P([k, n])], "{0} @ {1}", [[m, n]]),
                   ([P([a, m, k]), P([k, n])], "{0} @ {1}", [[a, m, n]]),
                   ([P([a, m, k]), P([a, k, n])], "{0} @ {1}", [[a, m, n]])]
    r["softmax"] = [(x3, "softmax({0})", [[a, b, c]]), (x3, "softmax({0}, dim = 1)", [[a, b, c]])]
    r["layernorm"] = [([P([a, b, c]), P([c]), P([c])], "layernorm({0}, {1}, {2})", [[a, b, c]])]
    r["rmsnorm"] = [([P([a, b, c]), P([c])], "rmsnorm({0}, {1})", [[a, b, c]])]
    for op in ["sum", "mean", "max"]:
        r[op] = [(x3, op + "({0}, dim = 1)", [[a, c]]),
                 (x3, op + "({0}, keepdim = true)", [[a, b, 1]])]
    r["argmax"] = [(x3, "cast(argmax({0}, dim = 1), f64) * sum({0}, dim = 1)", [[a, c]])]
    V = g.dim() + 2
    r["embed"] = [([P([V, c]), P([a, b], "i")], "embed({0}, {1})", [[a, b, c]])]
    r["gather"] = [([P([a, b, V]), P([a, b], "i")], "gather({0}, {1})", [[a, b]]),
                   ([P([a, V]), P([a, 2], "i")], "gather({0}, {1})", [[a, 2]])]
    r["scatter"] = [([P([a, V]), P([a, 2], "i"), P([a, 2])], "scatter({0}, {1}, {2})", [[a, V]])]
    r["topk"] = [([P([a, b, V])], "topk({0}, 2)", [[a, b, 2], [a, b, 2]])]
    S, D = g.dim(), 4  # two heads of 2
    q = [P([a, S, D])]
    r["rope"] = [(q, "rope({0}, heads = 2, theta = 100.0, rotate_half = true)", [[a, S, D]])]
    gqa = [P([a, S, D]), P([a, S, 2]), P([a, S, 2])]
    # one rule for every form: causal, two heads on one kv head
    # and cross-attention: keys and values of a length of their own, a key mask
    Sk = S + 2
    cross = [P([a, S, D]), P([a, Sk, 2]), P([a, Sk, 2]), P([a, Sk])]
    # and values of a head size of their own (latent attention): Dv 3, Dqk 2
    vdim = [P([a, S, D]), P([a, S, D]), P([a, S, 6])]
    # and a score bias per head (its heads split as q's), one for all heads over cross-attention
    bias = [P([a, S, D]), P([a, S, D]), P([a, S, D]), P([2, S, S])]
    bias1 = [P([a, S, D]), P([a, Sk, 2]), P([a, Sk, 2]), P([1, S, Sk])]
    r["attention"] = [(gqa, "attention({0}, {1}, {2}, heads = 2, kv_heads = 1, causal = true)",
                       [[a, S, D]]),
                      (cross, "attention({0}, {1}, {2}, heads = 2, kv_heads = 1, mask = {3} > 0.0)",
                       [[a, S, D]]),
                      (vdim, "attention({0}, {1}, {2}, heads = 2)", [[a, S, 6]]),
                      (bias, "attention({0}, {1}, {2}, heads = 2, causal = true, bias = {3})", [[a, S, D]]),
                      (bias1, "attention({0}, {1}, {2}, heads = 2, kv_heads = 1, bias = {3})",
                       [[a, S, D]])]
    r["cross_entropy"] = [([P([a, b, V]), P([a, b], "i")], "cross_entropy({0}, {1})", [[]])]
    r["reshape"] = [(x3, "reshape({0}, [%d, %d])" % (a, b * c), [[a, b * c]]),
                    (x3, "reshape({0}, [%d, %d])" % (a * b, c), [[a * b, c]])]
    r["expand"] = [([P([a, 1, c])], "expand({0}, [%d, %d, %d])" % (a, b, c), [[a, b, c]])]
    r["transpose"] = [(x3, "transpose({0})", [[a, c, b]]),
                      (x3, "transpose({0}, [2, 0, 1])", [[c, a, b]])]
    b4 = b + 2
    r["slice"] = [([P([a, b4, c])], "slice({0}, 1, %d, dim = 1)" % (b4 - 1), [[a, b4 - 2, c]])]
    r["concat"] = [([P([a, b, c]), P([a, 2, c])], "concat({0}, {1}, dim = 1)", [[a, b + 2, c]])]
    return r


def fmt_shape(shape, split=None):
    return "[" + ", ".join(str(s) + ("@tp" if i == split else "") for i, s in enumerate(shape)) + "]"


def model(name, ops, opt):
    """The TDL of one model holding every copy of each (op, variants) of ops:
    its text, its copies and, by op, the lines of its copies' expressions
    (to name the op of a diverging line)."""
    lines = ["model op_%s()" % name, "mesh tp: tensor"]
    body, terms, copies, owner = [], [], 0, []

    def operand(nm, shape, kind, split):
        if kind == "i":
            lines.append("input %s : i32%s" % (nm, fmt_shape(shape, split)))
            return nm
        lines.append("param %s : f64%s = normal(0.8)" % (nm, fmt_shape(shape, split)))
        return "exp(%s)" % nm if kind == "pos" else nm

    def partial(nm, shape, kind):
        """shape as a matrix product over a split contracted dim of 2."""
        lead = list(shape[:-1]) or [1]
        lines.append("param %s_a : f64%s = normal(0.8)" % (nm, fmt_shape(lead + [2], len(lead))))
        lines.append("param %s_b : f64%s = normal(0.8)" % (nm, fmt_shape([2, shape[-1]], 0)))
        e = "%s_a @ %s_b" % (nm, nm)
        if len(shape) == 1:
            e = "reshape(%s, [%d])" % (e, shape[0])
        return "exp(%s)" % e if kind == "pos" else "(%s)" % e

    def emit(op, operands, expr, outs, tag, split_of):
        nonlocal copies
        copies += 1
        names = []
        for j, (shape, kind) in enumerate(operands):
            nm = "%s_%d" % (tag, j)
            sp = split_of(j)
            names.append(partial(nm, shape, kind) if sp == "partial" else operand(nm, shape, kind, sp))
        res = ["%s_y%d" % (tag, i) for i in range(len(outs))]
        body.append("%s = %s" % (", ".join(res), expr.format(*names)))
        owner.append(op)
        for i, shape in enumerate(outs):
            y = res[i] if op != "topk" or i == 0 else "cast(%s, f64)" % res[i]
            if not shape:
                terms.append(y)
                continue
            lines.append("input %s_w%d : f64%s" % (tag, i, fmt_shape(shape)))
            t = "%s * %s_w%d" % (y, tag, i)
            for _ in shape:
                t = "sum(%s)" % t
            terms.append(t)

    for op, variants in ops:
        for v, (operands, expr, outs) in enumerate(variants):
            for j, (shape, kind) in enumerate(operands):
                for d, size in enumerate(shape):
                    if size % 2 == 0:
                        emit(op, operands, expr, outs, "%s_v%ds%dd%d" % (op, v, j, d),
                             lambda jj, j=j, d=d: d if jj == j else None)
                if kind != "i":
                    emit(op, operands, expr, outs, "%s_v%dp%d" % (op, v, j),
                         lambda jj, j=j: "partial" if jj == j else None)
    first = len(lines) + 1  # the 1-based line of body[0]
    line_op = {first + k: op for k, op in enumerate(owner)}
    lines += body
    lines.append("loss = " + " + ".join(terms))
    lines.append("train {")
    lines.append("    optimizer = " + opt)
    lines.append("    grad_clip = 1.0")
    lines.append("}")
    return "\n".join(lines) + "\n", copies, line_op


# Ops checked in one model together: their kernels compile in one go (the
# test's time is mostly compiling), and the first diverging value's line
# names the op. The rest take a model each.
GROUPS = [
    ["tanh", "sigmoid", "relu", "gelu", "silu", "erf", "exp", "neg", "stop_gradient", "log",
     "sqrt", "rsqrt", "cast", "dropout", "abs", "floor", "arange", "add", "sub", "mul", "div",
     "lt", "le", "gt", "ge", "eq", "ne", "where"],
    ["sum", "mean", "max", "argmax", "softmax", "layernorm", "rmsnorm", "matmul", "rope"],
    ["reshape", "expand", "transpose", "slice", "concat", "embed", "gather", "scatter", "topk",
     "cross_entropy"],
]

def table_ops():
    ops = []
    with open(os.path.join(ROOT, "ir", "ops.def")) as f:
        for line in f:
            m = re.match(r'OP\(\s*\w+\s*,\s*"([a-z_0-9]+)"', line)
            if m:
                ops.append(m.group(1))
    return ops


def run(tcc, path, args):
    return subprocess.run([tcc, path] + args, capture_output=True, text=True)


def check_group(job):
    """One model of ops through --verify on 2 devices: [(op, ok, report lines)]."""
    tcc, folder, name, ops, i = job
    opt = "adamw(lr = 0.01)" if i % 2 else "sgd(lr = 0.1, momentum = 0.9)"
    text, copies, line_op = model(name, ops, opt)
    path = os.path.join(folder, name + ".tdl")
    with open(path, "w") as f:
        f.write(text)
    ir = run(tcc, path, ["--mesh", "2", "--dump-after=autodiff", "--stop-after=autodiff"])
    r = run(tcc, path, ["--mesh", "2", "--verify"])
    verdict = [l for l in r.stdout.splitlines() if l.startswith(("verified", "FAILED"))]
    ok = r.returncode == 0 and verdict and ir.returncode == 0
    blamed = None
    for l in r.stdout.splitlines():
        m = re.match(r"\s+at .*:(\d+):\d+$", l)
        if m and blamed is None:
            blamed = line_op.get(int(m.group(1)))
    errs = (r.stderr or ir.stderr).strip().splitlines()
    why = verdict[-1].split(": ", 1)[-1] if verdict else (errs[-1] if errs else "no verdict")
    out = []
    for op, _ in ops:
        grads = [gop for gop, fwd in GRAD_OF.items() if fwd == op]
        missing = [gop for gop in grads if not re.search(r"= %s " % gop, ir.stdout)]
        n = sum(1 for o in line_op.values() if o == op)
        if ok and not missing:
            out.append((op, True, ["%s: verified (%d splits%s)" % (
                op, n, ", with " + " ".join(grads) if grads else "")]))
        elif missing:
            out.append((op, False, ["%s: FAILED: no %s after autodiff" % (op, ", ".join(missing))]))
        elif blamed in (None, op):
            lines = ["%s: FAILED: %s (model %s: --keep DIR --seed of the first line)" % (
                op, why, name)]
            lines += ["    " + l.strip() for l in r.stdout.splitlines()
                      if l.startswith(("first diverging", "  %", "  at "))]
            out.append((op, False, lines))
        else:
            out.append((op, False, ["%s: not judged: its model %s fails at %s" % (op, name, blamed)]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tcc")
    ap.add_argument("--ops", default="")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", default=None, help="write the models into this folder")
    o = ap.parse_args()
    seed = o.seed if o.seed is not None else random.SystemRandom().randrange(1 << 30)
    print("op_contract: seed %d (--seed %d replays these shapes)" % (seed, seed), flush=True)
    rng = random.Random(seed)
    rec = recipes(Gen(rng))
    table = table_ops()
    unknown = [op for op in table if op not in rec and op not in GRAD_OF
               and op not in MADE_BY_PASSES and op not in IN_EVERY_MODEL]
    passed = failed = 0
    for op in unknown:
        print("%s: FAILED: no recipe (tests/contract/op_contract.py): a new op needs one" % op)
        failed += 1
    with tempfile.TemporaryDirectory(prefix="op_contract.") as tmp:
        folder = o.keep or tmp
        os.makedirs(folder, exist_ok=True)
        want = [op for op in rec if not o.ops or op in o.ops.split(",")]
        grouped = {op for g in GROUPS for op in g}
        jobs = []
        for g in GROUPS + [[op] for op in rec if op not in grouped]:
            ops = [(op, rec[op]) for op in g if op in want]
            if ops:
                jobs.append((o.tcc, folder, ops[0][0] if len(ops) == 1 else "group%d" % len(jobs),
                             ops, len(jobs)))
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for results in pool.map(check_group, jobs):
                for op, ok, lines in results:
                    print("\n".join(lines), flush=True)
                    passed += ok
                    failed += not ok
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
