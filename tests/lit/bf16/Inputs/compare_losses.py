"""compare_losses.py A.log B.log STEPS RTOL FALL: the losses that two training
logs print, step by step. Fails (exit 1, naming the first bad step) when a step
is missing, when |a - b| > RTOL * |b|, or when A's last loss is not below
FALL times its first; else prints 'STEPS steps compared'."""
import re
import sys


def losses(path):
    out = {}
    for line in open(path):
        m = re.match(r'step\s+(\d+)/\d+\s+loss\s+([0-9.eE+-]+)', line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out


def main():
    a, b = losses(sys.argv[1]), losses(sys.argv[2])
    steps, rtol, fall = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    for s in range(1, steps + 1):
        if s not in a or s not in b:
            sys.exit('step %d missing from a log' % s)
        if abs(a[s] - b[s]) > rtol * abs(b[s]):
            sys.exit('step %d: loss %.6f vs %.6f, beyond relative %g' % (s, a[s], b[s], rtol))
    if not a[steps] < fall * a[1]:
        sys.exit('the loss did not fall: %.6f -> %.6f' % (a[1], a[steps]))
    print('%d steps compared, max relative difference %.2e' %
          (steps, max(abs(a[s] - b[s]) / abs(b[s]) for s in range(1, steps + 1))))


main()
