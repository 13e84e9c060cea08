"""same_steps.py REF.log LOG...: the losses that the LOGs print with --exact
(hexadecimal floats), step by step, are bitwise those of REF.log for the same
steps, and together the LOGs cover every step of REF.log once. Prints "N
steps equal" or the first difference; exit status 1 then."""
import re
import sys

LINE = re.compile(r'^step +(\d+)/\d+ +loss [-0-9.a-z]+ \((-?0x[0-9a-f.]+p[-+][0-9]+|nan|inf)\)', re.M)


def losses(path):
    with open(path) as f:
        return [(int(s), h) for s, h in LINE.findall(f.read())]


def main():
    ref = dict(losses(sys.argv[1]))
    got = []
    for path in sys.argv[2:]:
        got += losses(path)
    steps = [s for s, _ in got]
    if not ref or sorted(steps) != sorted(ref) or len(set(steps)) != len(steps):
        print('different steps: %s and %s' % (sorted(ref), steps))
        return 1
    for s, h in got:
        if h != ref[s]:
            print('step %d: %s, the reference %s' % (s, h, ref[s]))
            return 1
    print('%d steps equal' % len(got))
    return 0


sys.exit(main())
