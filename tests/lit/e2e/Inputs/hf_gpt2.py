"""A Hugging Face GPT-2 model directory of random weights, written as
transformers' GPT2LMHeadModel.save_pretrained writes it (config.json and
model.safetensors, or shards and model.safetensors.index.json; keys
"transformer.h.N.attn.c_attn.weight" and so on, Conv1D weights [in, out],
q, k and v side by side in c_attn), and the float64 loss of GPT-2 on a batch
of tokens with those weights as stored, read back by hf_loss.py.

usage: hf_gpt2.py OUTDIR L D H V POSITIONS S B DTYPE SHARDS
  DTYPE: F32, BF16 or F16, the checkpoint's; SHARDS: 1 (model.safetensors)
  or more (model-0000k-of-0000n.safetensors and the index). Writes
  OUTDIR/tokens.npy and OUTDIR/targets.npy (int32 [B, S]) and prints
  "reference loss X" (the weights as stored, in float64)."""
import json
import struct
import sys

import numpy as np

out, L, D, H, V, P, S, B = sys.argv[1], *map(int, sys.argv[2:9])
dtype, shards = sys.argv[9], int(sys.argv[10])
rng = np.random.default_rng(20261129)


def stored(x):
    """x as the checkpoint stores it: its bytes."""
    x = np.asarray(x, np.float64)
    if dtype == "F32":
        return x.astype("<f4").tobytes()
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    f = x.astype(np.float32).view(np.uint32).astype(np.uint64)  # bf16: round to nearest even
    return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype("<u2").tobytes()


params = {}
def param(name, *shape, scale=0.02, base=0.0):
    params["transformer." + name] = (stored(base + scale * rng.standard_normal(shape)), list(shape))


param("wte.weight", V, D)
param("wpe.weight", P, D, scale=0.01)
for i in range(L):
    p = "h.%d." % i
    param(p + "ln_1.weight", D, scale=0.1, base=1.0)
    param(p + "ln_1.bias", D, scale=0.1)
    param(p + "attn.c_attn.weight", D, 3 * D)
    param(p + "attn.c_attn.bias", 3 * D)
    param(p + "attn.c_proj.weight", D, D)
    param(p + "attn.c_proj.bias", D)
    param(p + "ln_2.weight", D, scale=0.1, base=1.0)
    param(p + "ln_2.bias", D, scale=0.1)
    param(p + "mlp.c_fc.weight", D, 4 * D)
    param(p + "mlp.c_fc.bias", 4 * D)
    param(p + "mlp.c_proj.weight", 4 * D, D)
    param(p + "mlp.c_proj.bias", D)
    # a buffer of older checkpoints, not a parameter: the importer leaves it
    params["transformer." + p + "attn.bias"] = (np.tril(np.ones((4, 4), "<f4")).tobytes(), [1, 1, 4, 4])
param("ln_f.weight", D, scale=0.1, base=1.0)
param("ln_f.bias", D, scale=0.1)


def write(path, names):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for k in names:
        data, shape = params[k]
        kind = "F32" if k.endswith(".attn.bias") else dtype
        header[k] = {"dtype": kind, "shape": shape, "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


names = list(params)
if shards == 1:
    write(out + "/model.safetensors", names)
else:
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        write(out + "/" + file, part)
        weight_map.update({k: file for k in part})
    json.dump({"metadata": {}, "weight_map": weight_map}, open(out + "/model.safetensors.index.json", "w"))
json.dump({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": L, "n_embd": D,
           "n_head": H, "vocab_size": V, "n_positions": P, "n_ctx": P,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
           "tie_word_embeddings": True}, open(out + "/config.json", "w"))

tokens = rng.integers(0, V, (B, S)).astype(np.int32)
targets = rng.integers(0, V, (B, S)).astype(np.int32)
np.save(out + "/tokens.npy", tokens)
np.save(out + "/targets.npy", targets)


sys.path.insert(0, __import__("os").path.dirname(__file__))
from hf_loss import loss_of  # noqa: E402  (reads the files just written, as stored)

print("reference loss %.9f" % loss_of(out, tokens, targets))
