"""mlm_data.py DIR S V: a masked-language-model data set for samples/bert.tdl
as its data pipeline would write it, with NumPy: 48 rows of S byte tokens
(below V - 1) cut from a repeated sentence, a quarter of the rows padded
from a random point on (token 0, real = 0), 15% of the real tokens masked
(replaced by the [MASK] id V - 1; at least one per row). Writes DIR/tokens.npy
(the masked tokens), labels.npy (the original ones), masked.npy and
real.npy (0/1 float32 flags), each (48, S)."""
import sys

import numpy as np


def main():
    d, s, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(19)
    text = np.frombuffer(b'the quick brown fox jumps over the lazy dog. ' * 200, np.uint8)
    rows = 48
    labels = np.stack([text[o:o + s] for o in rng.integers(0, len(text) - s, rows)]) % (v - 1)
    real = np.ones((rows, s), np.float32)
    for r in rng.choice(rows, rows // 4, replace=False):
        real[r, rng.integers(s // 2, s):] = 0
    labels = np.where(real > 0, labels, 0).astype(np.int32)
    masked = ((rng.random((rows, s)) < 0.15) & (real > 0)).astype(np.float32)
    masked[np.arange(rows), 0] = 1  # every row has a masked position
    tokens = np.where(masked > 0, v - 1, labels).astype(np.int32)
    for name, a in (('tokens', tokens), ('labels', labels), ('masked', masked), ('real', real)):
        np.save('%s/%s.npy' % (d, name), a)


main()
