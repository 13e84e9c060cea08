"""npy_feed.py write DIR | check DIR LOG FIRST LAST

write: x_000.npy (10 examples f32[4, 3]) and x_001.npy (7), y_000.npy and
y_001.npy (i32 labels in [0, 5)), written by NumPy itself (np.save), and
DIR/expected: the loss of Inputs/feed.tdl at steps 1..8, 8 examples a step
from the 17 in file order, wrapping (example (8 (step - 1) + g) mod 17 for
row g), computed in float64; all/x.npy, the 17 images in one file of
version 2.0 of the format. Also the files the loader must refuse.
check: the losses of steps FIRST..LAST in LOG (a training log) against
DIR/expected, within 1e-5 relative (the model sums in float32); prints
'losses match' or exits 1 naming the first step that does not."""
import re
import sys

import numpy as np


def write(d):
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((n, 4, 3)).astype(np.float32) for n in (10, 7)]
    ys = [rng.integers(0, 5, n).astype(np.int32) for n in (10, 7)]
    for i, (x, y) in enumerate(zip(xs, ys)):
        np.save('%s/x_%03d.npy' % (d, i), x)
        np.save('%s/y_%03d.npy' % (d, i), y)
    X, Y = np.concatenate(xs), np.concatenate(ys)
    with open(d + '/all/x.npy', 'wb') as f:  # the 17 in one file, version 2.0 of the format
        np.lib.format.write_array(f, X, version=(2, 0))
    with open(d + '/expected', 'w') as f:
        for step in range(8):
            idx = [(step * 8 + g) % 17 for g in range(8)]
            f.write('%r\n' % float((X[idx].astype(np.float64).sum(axis=(1, 2)) * Y[idx]).mean()))
    np.save(d + '/x64.npy', np.zeros((4, 4, 3)))
    np.save(d + '/xshape.npy', np.ones((4, 3, 4), np.float32))
    np.save(d + '/xfortran.npy', np.asfortranarray(np.ones((4, 4, 3), np.float32)))
    np.save(d + '/ybad.npy', np.array([0, 1, 7, 2], np.int32))
    np.save(d + '/yint64.npy', np.array([0, 1, 2, 3]))
    b = open('%s/x_000.npy' % d, 'rb').read()
    open(d + '/xtrunc.npy', 'wb').write(b[:-5])
    open(d + '/xlong.npy', 'wb').write(b + b'\0\0\0\0')
    open(d + '/notnpy.npy', 'wb').write(b'not an array at all')
    # a header whose 'descr' has no value (found by fuzz_npy: the message read past it)
    head = b"{'fortran_order': False, 'shape': (2, 4, 3), 'descr':"
    open(d + '/nodescr.npy', 'wb').write(b'\x93NUMPY\x01\x00' + bytes([len(head), 0]) + head)


def check(d, log, first, last):
    want = [float(v) for v in open(d + '/expected')]
    got = {}
    for line in open(log):
        m = re.match(r'step\s+(\d+)/\d+\s+loss\s+(\S+)', line)
        if m:
            got[int(m.group(1))] = float(m.group(2))
    for s in range(first, last + 1):
        w = want[s - 1]
        if s not in got or abs(got[s] - w) > 1e-5 * max(abs(w), 1.0):
            sys.exit('step %d: loss %s, the files give %.6f' % (s, got.get(s), w))
    print('losses match')


if __name__ == '__main__':
    if sys.argv[1] == 'write':
        write(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
