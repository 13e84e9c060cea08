"""same_losses.py A.log B.log [RTOL]: the losses two training logs print with
--exact (the hexadecimal floats: train and val losses, in order) agree to a
relative RTOL (default 1e-12). Prints "N losses agree" or the first that does
not; exit status 1 then, or when the logs hold different counts or none."""
import re
import sys

HEX = re.compile(r'loss [0-9.]+ \((-?0x[0-9a-f.]+p[-+][0-9]+)\)')


def losses(path):
    with open(path) as f:
        return [(line.split('  loss')[0].split('  val')[0].strip(), float.fromhex(m.group(1)))
                for line in f for m in [HEX.search(line)] if m]


def main():
    a, b = losses(sys.argv[1]), losses(sys.argv[2])
    rtol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-12
    if not a or len(a) != len(b):
        print('different counts: %d and %d losses' % (len(a), len(b)))
        return 1
    for (sa, x), (sb, y) in zip(a, b):
        if sa != sb or abs(x - y) > rtol * abs(y):
            print('%s: %r and %s: %r differ by more than %g' % (sa, x, sb, y, rtol))
            return 1
    print('%d losses agree' % len(a))
    return 0


sys.exit(main())
