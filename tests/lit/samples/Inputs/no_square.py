"""no_square.py MEMORY.json B H S: the step's memory (tcc --emit=memory's
JSON) holds no S x S score tensor of attention: every stage's peak, and so
every tensor alive at it, is under the bytes of one such tensor in 16 bits
(B x H x S x S x 2). Prints one line; exits 1 when a peak is not under."""
import json
import sys

path, b, h, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open(path) as f:
    model = json.load(f)
square = b * h * s * s * 2
worst = max(st['peak'] for st in model['stages'])
if worst >= square:
    print('a stage peaks at %d bytes, not under one %dx%d score tensor (%d bytes)' % (worst, s, s, square))
    sys.exit(1)
print('no S x S tensor: peak %d bytes < one score tensor of %d bytes' % (worst, square))
