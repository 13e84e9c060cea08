"""same_tensors.py A.safetensors B.safetensors: whether two checkpoints hold the
same tensors bit for bit (names, dtypes, shapes and bytes; the metadata, which
names the plan, is not compared). Prints 'N tensors identical' and exits 0, or
names the first tensor that differs and exits 1."""
import json
import struct
import sys


def tensors(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop('__metadata__', None)
    return {k: (v['dtype'], v['shape'], data[v['data_offsets'][0]:v['data_offsets'][1]])
            for k, v in header.items()}


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if sorted(a) != sorted(b):
    sys.exit('tensors differ: %s' % sorted(set(a) ^ set(b)))
for name in sorted(a):
    if a[name] != b[name]:
        sys.exit('tensor %s differs' % name)
print('%d tensors identical' % len(a))
