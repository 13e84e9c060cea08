"""The float64 loss of a Hugging Face GPT-2 directory on a batch, read as
transformers reads it (config.json; model.safetensors or the shards of
model.safetensors.index.json; F32, BF16 or F16; keys with or without
"transformer."; Conv1D weights [in, out]; q, k and v side by side in
c_attn) and computed from the model's definition: pre-norm blocks, causal
attention scaled by 1/sqrt(head), gelu_new, layer norms with the config's
eps, the output layer tied to wte, the mean cross-entropy over B x S.

usage: hf_loss.py DIR TOKENS.npy TARGETS.npy   (prints "reference loss X")"""
import json
import os
import struct
import sys

import numpy as np


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        b, t = e["data_offsets"]
        raw = data[b:t]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, "<f4").astype(np.float64)
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float64)
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise SystemExit("%s: dtype %s" % (k, e["dtype"]))
        out[k[len("transformer."):] if k.startswith("transformer.") else k] = a.reshape(e["shape"])
    return out


def read_dir(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    index = os.path.join(d, "model.safetensors.index.json")
    w = {}
    if os.path.exists(index):
        for f in sorted(set(json.load(open(index))["weight_map"].values())):
            w.update(read_st(os.path.join(d, f)))
    else:
        w = read_st(os.path.join(d, "model.safetensors"))
    return cfg, w


def loss_of(d, tokens, targets):
    cfg, w = read_dir(d)
    H, L, eps = cfg["n_head"], cfg["n_layer"], cfg.get("layer_norm_epsilon", 1e-5)
    B, S = tokens.shape
    D = w["wte.weight"].shape[1]

    def layernorm(x, g, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * g + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    x = w["wte.weight"][tokens] + w["wpe.weight"][:S]
    dh, mask = D // H, np.tril(np.ones((S, S), bool))
    for i in range(L):
        p = "h.%d." % i
        h = layernorm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[..., j * D:(j + 1) * D].reshape(B, S, H, dh).transpose(0, 2, 1, 3)
                   for j in range(3))
        s = np.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh), -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
        x = x + o @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layernorm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        x = x + gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ \
            w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    logits = layernorm(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, targets[..., None], -1).mean()


if __name__ == "__main__":
    print("reference loss %.9f" % loss_of(sys.argv[1], np.load(sys.argv[2]), np.load(sys.argv[3])))
