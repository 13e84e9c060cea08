"""One gradient buffer per weight (issue 34, point 2), from a loop plan's
plan.json: every GEMM that a microbatch's weight gradient becomes adds its
product into the sum over microbatches (acc 1, beta 1; the runtime runs the
first microbatch's with beta 0), and in bf16 the sum is f32 while A and B
are bf16 (the GEMM's f32 accumulation is not rounded to bf16). Prints the
count of such GEMMs, of the other GEMMs of the backward, and of the sums
still added by a kernel (biases, norm gains, an embedding's rows, the loss).

usage: grad_buffer.py PLANDIR"""
import json
import sys

p = json.load(open(sys.argv[1] + "/plan.json"))
T = p["tensors"]
acc_gemm = plain_bwd = acc_kernel = 0
bad = []
for i, x in enumerate(p["instrs"]):
    if x["kind"] == "gemm" and x.get("acc"):
        g = x["gemm"]
        acc_gemm += 1
        if g["beta"] != 1:
            bad.append("instrs[%d]: beta %s" % (i, g["beta"]))
        if T[g["a"]]["dtype"] == "bf16" and T[g["c"]]["dtype"] != "f32":
            bad.append("instrs[%d]: bf16 operands into a %s sum" % (i, T[g["c"]]["dtype"]))
    elif x["kind"] == "gemm" and x["phase"] == 1:
        plain_bwd += 1
    elif x["kind"] == "kernel" and x.get("acc"):
        acc_kernel += 1
print("gemms adding into their sum %d, other backward gemms %d, sums added by kernels %d" %
      (acc_gemm, plain_bwd, acc_kernel))
for b in bad:
    print("BAD " + b)
sys.exit(1 if bad else 0)
