"""npy_shift.py N S D A: an f32 array (N, S, D) in NumPy's .npy format (version
1.0, written here by hand: no NumPy needed) on standard output, element
[n, s, d] = A * sin(n + 0.1 s + 0.7 d): zeros for A = 0."""
import math
import struct
import sys


def main():
    n, s, d, a = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    head = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }" % (n, s, d)
    head += ' ' * (63 - (10 + len(head)) % 64) + '\n'  # the data start 64-aligned
    vals = [a * math.sin(i + 0.1 * j + 0.7 * k) for i in range(n) for j in range(s) for k in range(d)]
    out = sys.stdout.buffer
    out.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(head)) + head.encode())
    out.write(struct.pack('<%df' % len(vals), *vals))


main()
