"""scores_not_per_row.py SMALL.json BIG.json B_SMALL B_BIG H S: the step's
memory (tcc --emit=memory's JSON, at two batch sizes) holds no S x S score
tensor per row of the batch. A model may hold S x S tensors that are not per
row (T5's position bias, H x S x S, shared by the batch and the layers), so
the check is on growth: from B_SMALL to B_BIG rows, every stage's peak grows
by less than the scores of the added rows would take in 16 bits
((B_BIG - B_SMALL) x H x S x S x 2 bytes). Prints one line; exits 1 when a
peak grows by that much."""
import json
import sys

small, big = (json.load(open(p)) for p in sys.argv[1:3])
b0, b1, h, s = (int(x) for x in sys.argv[3:7])
rows = (b1 - b0) * h * s * s * 2
for a, b in zip(small['stages'], big['stages']):
    grow = b['peak'] - a['peak']
    if grow >= rows:
        print('stage %d peaks %d bytes higher at %d rows than at %d: the scores of %d rows take %d'
              % (a['stage'], grow, b1, b0, b1 - b0, rows))
        sys.exit(1)
grow = max(b['peak'] - a['peak'] for a, b in zip(small['stages'], big['stages']))
print('no S x S tensor per row: the peak grows by %d bytes from %d to %d rows, under the %d bytes of their scores'
      % (grow, b0, b1, rows))
