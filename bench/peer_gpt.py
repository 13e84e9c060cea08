#!/usr/bin/env python3
"""peer_gpt.py: the model of samples/gpt2.tdl in PyTorch, trained as a careful
PyTorch user trains it on the CPU, for bench/peer.sh.

    python3 bench/peer_gpt.py L D H S B V STEPS

Same blocks as the sample (pre-norm, causal attention with a bias on the
q/k/v projection, tanh GELU, learned positions, the output layer tied to the
token embedding), the same initialization scales, AdamW with the sample's
hyperparameters (lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on every
parameter, as tcc's adamw does) and gradient clipping at 1.0, in f32 on one
fixed batch of random tokens. The optimizer is foreach AdamW (fused where the
installed PyTorch has it for the CPU), on every core (torch.set_num_threads:
OMP_NUM_THREADS, else the core count), attention is
scaled_dot_product_attention where the version has it, and with PyTorch 2
and TCC_PEER_COMPILE=1 the model is compiled with torch.compile. Prints one
line per step, `step K ms T`, and a last line `torch VERSION threads N`."""
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, h, layers):
        super().__init__()
        self.h = h
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.mlp = torch.nn.Linear(4 * d, d)
        for lin, std in ((self.attn, 0.02), (self.fc, 0.02),
                         (self.proj, 0.02 / math.sqrt(2 * layers)),
                         (self.mlp, 0.02 / math.sqrt(2 * layers))):
            torch.nn.init.normal_(lin.weight, std=std)
            torch.nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x: the scores, masked, softmaxed
            a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            y = a.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, layers, d, h, s, v):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.randn(v, d) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(s, d) * 0.01)
        self.blocks = torch.nn.ModuleList(Block(d, h, layers) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(d)

    def forward(self, tokens, targets):
        x = F.embedding(tokens, self.wte) + self.wpe
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main(argv):
    if len(argv) != 8:
        sys.exit(__doc__)
    layers, d, h, s, b, v, steps = (int(a) for a in argv[1:])
    # every core, as tcc's programs run: Debian's build starts with one OpenMP thread here
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(1337)
    model = GPT(layers, d, h, s, v)
    kw = {"lr": 6e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **kw)
        opt.step()  # a CPU without fused AdamW says so here
        opt.zero_grad(set_to_none=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **kw)
    step = model
    if os.environ.get("TCC_PEER_COMPILE") == "1" and hasattr(torch, "compile"):
        step = torch.compile(model)
    tokens = torch.randint(0, v, (b, s))
    targets = torch.randint(0, v, (b, s))
    for k in range(1, steps + 1):
        t0 = time.perf_counter()
        loss = step(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        print("step %d ms %.1f loss %.4f" % (k, ms, loss.item()), flush=True)
    print("torch %s threads %d" % (torch.__version__, torch.get_num_threads()))


if __name__ == "__main__":
    main(sys.argv)
