"""Compare two plans of one model on two meshes: device counts, tensor and
kernel counts, and the file sizes without the mesh table (the "axes" list)."""
import json
import sys


def load(path):
    with open(path) as f:
        text = f.read()
    plan = json.loads(text)
    table = len(json.dumps(plan["axes"]))
    return plan, len(text) - table


def devices(plan):
    n = 1
    for axis in plan["axes"]:
        n *= axis["size"]
    return n


small, small_size = load(sys.argv[1])
big, big_size = load(sys.argv[2])
print("devices", devices(small), devices(big))
same = len(small["tensors"]) == len(big["tensors"]) and len(small["kernels"]) == len(big["kernels"])
print("tensors %s, kernels %s" % (("equal",) * 2 if same else ("differ",) * 2))
verdict = "big <= small" if big_size <= small_size else "big > small"
print("size without the mesh table: %s (%d vs %d bytes)" % (verdict, big_size, small_size))
