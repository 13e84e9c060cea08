"""images_data.py DIR N C HW K: an image classification data set for
samples/vit.tdl, written with NumPy: N images (C, HW, HW) float32 of noise
with a bright square in one of K places (the class: a quadrant for K = 4,
then along the diagonal), split into images_000.npy (the first half) and
images_001.npy, and labels_000.npy, labels_001.npy int32 (the classes)."""
import sys

import numpy as np


def main():
    d, n, c, hw, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rng = np.random.default_rng(7)
    labels = rng.integers(0, k, n).astype(np.int32)
    images = (0.3 * rng.standard_normal((n, c, hw, hw))).astype(np.float32)
    q = hw // 2
    for i, y in enumerate(labels):
        r, s = (y // 2) * q if k == 4 else y * hw // k, (y % 2) * q if k == 4 else y * hw // k
        images[i, :, r:r + q // 2 + 1, s:s + q // 2 + 1] += 1.0
    h = n // 2
    for part, sl in (('000', slice(0, h)), ('001', slice(h, n))):
        np.save('%s/images_%s.npy' % (d, part), images[sl])
        np.save('%s/labels_%s.npy' % (d, part), labels[sl])


main()
