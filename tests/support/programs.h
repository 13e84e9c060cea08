/* programs.h: small TDL programs that exercise every op, shared by the
 * gradient checks (test_autodiff.c) and the kernel checks (test_codegen.c).
 * Each loss weighs an op's result with a random input, so every element of
 * every gradient matters; sizes are odd on purpose. Ids lie in [0, 5). */
#ifndef TCC_PROGRAMS_H
#define TCC_PROGRAMS_H

#define PROG_ARITHMETIC_WITH_BROADCASTING \
    "input r : f32[3, 5]\n" \
    "param a : f32[3, 5] = normal(1)\n" \
    "param b : f32[5] = normal(1)\n" \
    "param s : f32[] = normal(1)\n" \
    "y = (a + b) * (a - b) / (b * b + 2) - a * s + 0.5 / (a * a + 1)\n" \
    "loss = sum(sum(y * r))\n"

#define PROG_UNARY_FUNCTIONS \
    "input r : f32[3, 7]\n" \
    "param a : f32[3, 7] = normal(1)\n" \
    "y = exp(a * 0.3) + log(a * a + 1) + sqrt(a * a + 1) + rsqrt(a * a + 1) + tanh(a) + erf(a)\n" \
    "z = sigmoid(a) + relu(a) + gelu(a) + silu(a) - a\n" \
    "loss = sum(sum((y + z) * r))\n"

/* Positions (issue 38): arange's rows and columns make the relative
 * position i - j of a 5 x 7 grid, abs and floor bucket it (T5's relative
 * buckets, cast to ids of a bias table); abs and floor of a parameter too
 * (abs's gradient is sign(a); floor's is none: its steps are a third apart,
 * and a random a lies within the finite difference's 1e-5 of one with
 * probability 6e-5 an element). */
#define PROG_POSITIONS \
    "input r : f32[5, 7]\n" \
    "param a : f32[5, 7] = normal(1)\n" \
    "param bias : f32[4, 1] = normal(1)\n" \
    "rel = expand(reshape(arange(5, dtype = f32), [5, 1]), [5, 7]) - arange(7, dtype = f32)\n" \
    "bucket = cast(floor(abs(rel) / 2.0), i32)\n" \
    "y = abs(a) * (rel + 0.5) + floor(a * 3.0) * a + reshape(embed(bias, bucket), [5, 7])\n" \
    "loss = sum(sum(y * r))\n"

/* stop_gradient in the middle of a chain (a value used twice, once stopped)
 * and on a whole term of the loss. */
#define PROG_STOP_GRADIENT \
    "input r : f32[3, 7]\n" \
    "param a : f32[3, 7] = normal(1)\n" \
    "param b : f32[7] = normal(1)\n" \
    "h = tanh(a * b)\n" \
    "loss = sum(sum(h * stop_gradient(h) * r)) + sum(stop_gradient(b * b)) * 5.0\n"

/* Comparisons as masks (issue 19): of floats against floats, numbers and a
 * broadcast vector, of i32 ids, each form once; a masked mean, whose mask
 * depends on a parameter but passes no gradient. */
#define PROG_COMPARISONS \
    "input r : f32[3, 7]\n" \
    "input t : i32[3, 7]\n" \
    "input u : i32[7]\n" \
    "param a : f32[3, 7] = normal(1)\n" \
    "param b : f32[7] = normal(1)\n" \
    "keep = cast(t == u, f32) + cast(t != u, f32) * (a > b)\n" \
    "m = (a >= 0.0) * (a < b) + (a <= -0.5) - (b == b) * (b != a)\n" \
    "loss = sum(sum(a * keep * r + m * a * b * r)) / sum(sum(keep + 1.0))\n"

/* where (issue 19): a mask or i32 ids as the condition, operands that
 * broadcast ([3,1] against [3,7], [7]), numbers as either branch or both;
 * the gradient reaches each branch where it is chosen, summed back to its
 * shape, and none the condition. */
#define PROG_WHERE \
    "input r : f32[3, 7]\n" \
    "input t : i32[3, 7]\n" \
    "param a : f32[3, 7] = normal(1)\n" \
    "param b : f32[7] = normal(1)\n" \
    "param c : f32[3, 1] = normal(1)\n" \
    "y = where(a > b, a * b, c) + where(a > 0.0, a, 0.0) + where(t, b, a * 2.0)\n" \
    "z = where(b < 0.5, 1.0, -1.0) * tanh(a) + where(c, 0.5, a)\n" \
    "loss = sum(sum((y + z) * r))\n"

/* argmax (issue 19) as routing: each token's expert (the gate's argmax) picks
 * its row of a table by embed, which trains that row and not the gate; and
 * over dim 0 with keepdim, of a relu whose all-zero columns tie (the first
 * wins), as a weight. */
#define PROG_ARGMAX \
    "input x : f32[3, 5, 4]\n" \
    "input r : f32[3, 5, 6]\n" \
    "param g : f32[4, 3] = normal(1)\n" \
    "param e : f32[3, 6] = normal(1)\n" \
    "param w : f32[4, 6] = normal(1)\n" \
    "k = argmax(x @ g)\n" \
    "j = argmax(relu(x @ w), dim = 0, keepdim)\n" \
    "h = x @ w + embed(e, k)\n" \
    "loss = sum(sum(sum(h * r * (cast(j, f32) + 1.0))))\n"

#define PROG_MATMUL_SHARED_AND_BATCHED \
    "input r : f32[2, 3, 5]\n" \
    "param x : f32[2, 3, 4] = normal(1)\n" \
    "param w : f32[4, 5] = normal(1)\n" \
    "param b : f32[2, 4, 5] = normal(1)\n" \
    "loss = sum(sum(sum((x @ w + x @ b) * r)))\n"

#define PROG_SOFTMAX_OVER_EACH_DIM \
    "input r : f32[3, 5]\n" \
    "param a : f32[3, 5] = normal(1)\n" \
    "loss = sum(sum((softmax(a) + softmax(a, dim = 0)) * r))\n"

#define PROG_LAYERNORM_AND_RMSNORM \
    "input r : f32[3, 7]\n" \
    "param x : f32[3, 7] = normal(1)\n" \
    "param g : f32[7] = normal(1)\n" \
    "param b : f32[7] = normal(1)\n" \
    "param h : f32[7] = normal(1)\n" \
    "loss = sum(sum((layernorm(x, g, b) + rmsnorm(x * 0.7, h, eps = 1e-3)) * r))\n"

#define PROG_REDUCTIONS \
    "input r : f32[3]\n" \
    "input q : f32[5]\n" \
    "input k : f32[3, 1]\n" \
    "param a : f32[3, 5] = normal(1)\n" \
    "y = sum(sum(a, dim = 1) * r) + sum(mean(a, dim = 0) * q) + sum(max(a) * r)\n" \
    "loss = y + sum(sum(max(a, dim = 1, keepdim = true) * k))\n"

#define PROG_EMBEDDING_GATHER \
    "input ids : i32[2, 3]\n" \
    "input r : f32[2, 3, 4]\n" \
    "param t : f32[5, 4] = normal(1)\n" \
    "loss = sum(sum(sum(embed(t, ids) * r)))\n"

#define PROG_ROTARY_EMBEDDING \
    "input r : f32[2, 3, 8]\n" \
    "param x : f32[2, 3, 8] = normal(1)\n" \
    "loss = sum(sum(sum(rope(x, heads = 2, theta = 100) * r)))" \
    " + sum(sum(sum(rope(x * x, heads = 2, theta = 100, rotate_half = true) * r)))\n"

/* rope's two layouts: rotate_half's pairs (p, p + Dh/2) are the pairs
 * (2p, 2p + 1) of the features reordered [x_0, x_h, x_1, x_{h+1}, ...]; the
 * loss is the squared difference of the two ways, 0 up to rounding. */
#define PROG_ROPE_LAYOUTS \
    "input x : f32[2, 3, 12]\n" \
    "a = rope(x, heads = 2, theta = 100, rotate_half = true)\n" \
    "p = reshape(transpose(reshape(x, [2, 3, 2, 2, 3])), [2, 3, 12])\n" \
    "b = reshape(transpose(reshape(rope(p, heads = 2, theta = 100), [2, 3, 2, 3, 2])), [2, 3, 12])\n" \
    "loss = sum(sum(sum((a - b) * (a - b))))\n"

/* attention's window and mask (issue 19), at S: a window of 2 with a mask
 * that hides about half the keys (some queries see none: output 0), a causal
 * window of 3, a causal i32 mask, and a mask that hides every key. */
#define PROG_ATTENTION_WINDOW_AND_MASK(S) \
    "input r : f32[2, " #S ", 6]\n" \
    "input mi : f32[2, " #S "]\n" \
    "param q : f32[2, " #S ", 6] = normal(1)\n" \
    "param k : f32[2, " #S ", 6] = normal(1)\n" \
    "param v : f32[2, " #S ", 6] = normal(1)\n" \
    "m = mi > 0.0\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 2, window = 2, mask = m) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 2, causal, window = 3) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 2, causal, mask = cast(mi > 0.5, i32)) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 2, mask = mi > 100.0) * r)))\n"

/* gather (issue 19): a masked language model's loss, each row's log-softmax
 * at its target weighted by a mask (mean over the masked rows only), and the
 * gate probability of each row's top expert (argmax). */
#define PROG_GATHER \
    "input t : i32[3, 4]\n" \
    "input mi : f32[3, 4]\n" \
    "param l : f32[3, 4, 7] = normal(1)\n" \
    "param g : f32[3, 4, 5] = normal(1)\n" \
    "w = mi > 0.0\n" \
    "lse = log(sum(exp(l)))\n" \
    "ce = lse - gather(l, t)\n" \
    "p = softmax(g)\n" \
    "loss = sum(sum(ce * w)) / (sum(sum(w)) + 1.0) + sum(sum(gather(p, argmax(g)) * mi))\n"

/* topk (issue 19): a top-2 router's renormalized weights over 5 experts
 * times a value per expert chosen by the indices (cast: no gradient), and the
 * top 3 of rows of 7 with ties (relu(h - 0.8): most are 0, taken by index). */
#define PROG_TOPK \
    "input r : f32[3, 4, 2]\n" \
    "input e : f32[3, 4, 2]\n" \
    "param g : f32[3, 4, 5] = normal(1)\n" \
    "param h : f32[2, 7] = normal(1)\n" \
    "v, i = topk(softmax(g), 2)\n" \
    "w = v / sum(v, keepdim)\n" \
    "u, j = topk(relu(h - 0.8), k = 3)\n" \
    "loss = sum(sum(sum(w * r * (cast(i, f32) + 1.0)))) + sum(sum(u * cast(j, f32))) * 0.1\n"

/* attention's scale (issue 38): T5 scales its scores by 1, not 1/sqrt(d);
 * a small scale as well, both causal and not, over two key tiles. */
#define PROG_ATTENTION_SCALE \
    "input r : f32[2, 70, 12]\n" \
    "param q : f32[2, 70, 12] = normal(1)\n" \
    "param k : f32[2, 70, 12] = normal(1)\n" \
    "param v : f32[2, 70, 12] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3, causal, scale = 1.0) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 3, scale = 0.125) * r)))\n"

/* attention's soft cap (Gemma 2): the scaled scores s become c tanh(s / c).
 * Scores of a few units (scale 1 over heads of 4) against c = 2, half
 * saturated; then c = 1.5 under ALiBi's bias (after the cap) and a window,
 * over two key tiles. */
#define PROG_ATTENTION_SOFTCAP \
    "input r : f32[2, 70, 12]\n" \
    "param q : f32[2, 70, 12] = normal(1)\n" \
    "param k : f32[2, 70, 12] = normal(1)\n" \
    "param v : f32[2, 70, 12] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3, causal, scale = 1.0, softcap = 2.0) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 3, alibi, window = 20, softcap = 1.5) * r)))\n"

/* cross-attention: 20 queries against 70 keys (two key tiles of 64), 3
 * heads; then one shared kv head under a key mask [2, 70] hiding about
 * half the keys; then 7 keys (fewer than the queries) with a soft cap. */
#define PROG_CROSS_ATTENTION \
    "input r : f32[2, 20, 12]\n" \
    "input mi : f32[2, 70]\n" \
    "param q : f32[2, 20, 12] = normal(1)\n" \
    "param k : f32[2, 70, 12] = normal(1)\n" \
    "param v : f32[2, 70, 12] = normal(1)\n" \
    "param k1 : f32[2, 70, 4] = normal(1)\n" \
    "param v1 : f32[2, 70, 4] = normal(1)\n" \
    "param k2 : f32[2, 7, 12] = normal(1)\n" \
    "param v2 : f32[2, 7, 12] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k1, v1, heads = 3, kv_heads = 1, mask = mi > 0.0) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k2, v2, heads = 3, softcap = 2.0) * r)))\n"

/* values of a head size of their own (DeepSeek-V2's latent attention): q,
 * k [2, 70, 12] with 3 heads (Dqk 4), v [2, 70, 18] (Dv 6) over two key
 * tiles of 64, causal; then one shared kv head (v [2, 70, 5], Dv 5); then
 * 20 queries against 70 keys (cross-attention) with values of Dv 2 under a
 * key mask and a soft cap. */
#define PROG_ATTENTION_VDIM \
    "input r : f32[2, 70, 18]\n" \
    "input r1 : f32[2, 70, 15]\n" \
    "input r2 : f32[2, 20, 6]\n" \
    "input mi : f32[2, 70]\n" \
    "param q : f32[2, 70, 12] = normal(1)\n" \
    "param k : f32[2, 70, 12] = normal(1)\n" \
    "param v : f32[2, 70, 18] = normal(1)\n" \
    "param k1 : f32[2, 70, 4] = normal(1)\n" \
    "param v1 : f32[2, 70, 5] = normal(1)\n" \
    "param q2 : f32[2, 20, 12] = normal(1)\n" \
    "param v2 : f32[2, 70, 6] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3, causal) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k1, v1, heads = 3, kv_heads = 1) * r1)))\n" \
    "loss = loss + sum(sum(sum(attention(q2, k, v2, heads = 3, mask = mi > 0.0, softcap = 2.0) * r2)))\n"

/* attention's score bias (T5's relative position bias): a learned bias per
 * head [3, 70, 70] added after a soft cap, causal over two key tiles; one
 * bias for all heads [1, 20, 70] over cross-attention with one shared kv
 * head under a key mask; a bias that is an input (no gradient) beside
 * ALiBi and a window. */
#define PROG_ATTENTION_BIAS \
    "input r : f32[2, 70, 12]\n" \
    "input r2 : f32[2, 20, 12]\n" \
    "input mi : f32[2, 70]\n" \
    "input bi : f32[3, 70, 70]\n" \
    "param q : f32[2, 70, 12] = normal(1)\n" \
    "param k : f32[2, 70, 12] = normal(1)\n" \
    "param v : f32[2, 70, 12] = normal(1)\n" \
    "param q2 : f32[2, 20, 12] = normal(1)\n" \
    "param k1 : f32[2, 70, 4] = normal(1)\n" \
    "param v1 : f32[2, 70, 4] = normal(1)\n" \
    "param bh : f32[3, 70, 70] = normal(1)\n" \
    "param b1 : f32[1, 20, 70] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3, causal, softcap = 2.0, bias = bh) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q2, k1, v1, heads = 3, kv_heads = 1, mask = mi > 0.0, bias = b1) * r2)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 3, alibi, window = 20, bias = bi) * r)))\n"

/* ALiBi (issue 19): 3 heads (the slopes of the largest power of 2 below,
 * then one of the odd sequence), causal and bidirectional with a window,
 * over S = 70: two key tiles of 64. */
#define PROG_ALIBI \
    "input r : f32[2, 70, 12]\n" \
    "param q : f32[2, 70, 12] = normal(1)\n" \
    "param k : f32[2, 70, 12] = normal(1)\n" \
    "param v : f32[2, 70, 12] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3, causal, alibi) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 3, alibi, window = 20) * r)))\n"

/* Two attentions alike but for ALiBi: each needs a kernel of its own (the
 * plan's kernels were shared by their shapes, ALiBi not compared: the
 * forward without ALiBi served both). */
#define PROG_ALIBI_AND_NOT \
    "input r : f32[2, 20, 12]\n" \
    "param q : f32[2, 20, 12] = normal(1)\n" \
    "param k : f32[2, 20, 12] = normal(1)\n" \
    "param v : f32[2, 20, 12] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 3, causal) * r)))\n" \
    "loss = loss + sum(sum(sum(attention(q, k, v, heads = 3, causal, alibi) * r)))\n"

/* dropout (issue 19): at p = 0.3 on a parameter and at 0.6 after a matmul,
 * each element's mask fixed by its row's key, the step and the call, so the
 * finite differences see the mask autodiff's backward applies. */
#define PROG_DROPOUT \
    "input r : f32[4, 3, 6]\n" \
    "param x : f32[4, 3, 6] = normal(1)\n" \
    "param w : f32[6, 5] = normal(1)\n" \
    "y = dropout(x, 0.3)\n" \
    "z = dropout(tanh(y @ w), p = 0.6)\n" \
    "loss = sum(sum(sum(y * r))) + sum(sum(sum(z * z)))\n"

/* scatter and a gather of k per row (issue 19): 12 values per row added into
 * rows of 5 (repeated indices summed: the looped kernel), 2 per row at
 * indices from a float input, some outside [0, 5) and dropped (the unrolled
 * kernel), and 12 per row gathered from rows of 7. */
#define PROG_SCATTER \
    "input ix : i32[3, 12]\n" \
    "input r : f32[3, 5]\n" \
    "input s : f32[3, 2]\n" \
    "param x : f32[3, 5] = normal(1)\n" \
    "param src : f32[3, 12] = normal(1)\n" \
    "param g : f32[3, 7] = normal(1)\n" \
    "y = scatter(x, ix, src * src)\n" \
    "z = scatter(y * 0.5, cast(s * 4.0 - 1.0, i32), slice(src, 0, 2, dim = 1))\n" \
    "w = gather(g, ix)\n" \
    "loss = sum(sum(y * r)) + sum(sum(z * z)) * 0.1 + sum(sum(w * src))\n"

#define PROG_GROUPED_QUERY_ATTENTION_NON_CAUSAL \
    "input r : f32[2, 5, 8]\n" \
    "param q : f32[2, 5, 8] = normal(1)\n" \
    "param k : f32[2, 5, 4] = normal(1)\n" \
    "param v : f32[2, 5, 4] = normal(1)\n" \
    "loss = sum(sum(sum(attention(q, k, v, heads = 4, kv_heads = 2) * r)))\n"

#define PROG_CROSS_ENTROPY \
    "input t : i32[3, 2]\n" \
    "param z : f32[3, 2, 5] = normal(1)\n" \
    "loss = cross_entropy(z * 2, t)\n"

#define PROG_DATA_MOVEMENT \
    "input r : f32[5, 6]\n" \
    "input q : f32[3, 2, 5]\n" \
    "param a : f32[6, 5] = normal(1)\n" \
    "param b : f32[2, 5] = normal(1)\n" \
    "y = transpose(a) + reshape(transpose(a, perm = [1, 0]), [5, 6]) * 0.5\n" \
    "z = concat(slice(a, 0, 3, dim = 0), b * 2, slice(a, 4, 6, dim = 0), dim = 0)\n" \
    "loss = sum(sum(y * r)) + sum(sum(sum(reshape(slice(z, 1, 7, dim = 0), [3, 2, 5]) * q)))\n"

/* expand: a vector to leading dimensions (a class token per row), and a
 * size-1 dimension stretched; the copies' gradients summed back. */
#define PROG_EXPAND \
    "input x : f32[3, 4, 5]\n" \
    "input r : f32[3, 5, 5]\n" \
    "param tok : f32[5] = normal(1)\n" \
    "param col : f32[4, 1] = normal(1)\n" \
    "t = expand(tok, [3, 1, 5])\n" \
    "h = concat(t, x * expand(col, [3, 4, 5]), dim = 1)\n" \
    "loss = sum(sum(sum(h * h * r)))\n"

#define PROG_MATMUL_OTHER_SHAPES \
    "input r : f32[1, 1]\n" \
    "input q : f32[3, 5, 9]\n" \
    "param a : f32[1, 7] = normal(1)\n" \
    "param w : f32[7, 1] = normal(1)\n" \
    "param x : f32[3, 5, 2] = normal(1)\n" \
    "param b : f32[3, 2, 9] = normal(1)\n" \
    "loss = sum(sum(a @ w * r)) + sum(sum(sum(x @ b * q)))\n"

#define PROG_ROWS_OF_ONE_THREE_AND_THIRTEEN \
    "input r : f32[4, 13]\n" \
    "input q : f32[2, 3]\n" \
    "param a : f32[4, 13] = normal(1)\n" \
    "param c : f32[2, 3] = normal(1)\n" \
    "param g : f32[3] = normal(1)\n" \
    "param one : f32[5, 1] = normal(1)\n" \
    "y = sum(sum(softmax(a) * r)) + sum(sum(layernorm(c, g, g) * q))\n" \
    "loss = y + sum(sum(softmax(one) * 3)) + sum(sum(rmsnorm(c, g) * q))\n"

#define PROG_ATTENTION_ONE_TOKEN_AND_ONE_SHARED_KV_HEAD \
    "input r : f32[3, 1, 6]\n" \
    "input u : f32[1, 9, 6]\n" \
    "param q : f32[3, 1, 6] = normal(1)\n" \
    "param k : f32[3, 1, 6] = normal(1)\n" \
    "param v : f32[3, 1, 6] = normal(1)\n" \
    "param q2 : f32[1, 9, 6] = normal(1)\n" \
    "param k2 : f32[1, 9, 2] = normal(1)\n" \
    "param v2 : f32[1, 9, 2] = normal(1)\n" \
    "y = sum(sum(sum(attention(q, k, v, heads = 6, causal) * r)))\n" \
    "loss = y + sum(sum(sum(attention(q2, k2, v2, heads = 3, kv_heads = 1, causal) * u)))\n"

/* samples/FILE with its `model NAME(...)` line replaced by model_line (kept
 * when NULL), in a static buffer; NULL when the file cannot be read. */
const char *test_sample(const char *file, const char *model_line);

#endif
