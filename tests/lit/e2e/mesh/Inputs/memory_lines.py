"""memory_lines.py LOG RANKS: the --report-memory lines of a log, one per rank
0..RANKS-1 in order, each with touched <= slab, touched > 90% of the slab (the
slab's top is reached at the peak of the step) and peak = touched + buffers.
Prints "N memory lines agree" or the first that does not (exit status 1)."""
import re
import sys

LINE = re.compile(r'^memory: rank (\d+) stage (\d+): slab (\d+) bytes \(touched (\d+)\), '
                  r'buffers (\d+) bytes, peak (\d+) bytes$')


def main():
    with open(sys.argv[1]) as f:
        lines = [m for m in (LINE.match(l.rstrip('\n')) for l in f) if m]
    ranks = int(sys.argv[2])
    if [int(m.group(1)) for m in lines] != list(range(ranks)):
        print('ranks %s, expected 0..%d' % ([m.group(1) for m in lines], ranks - 1))
        return 1
    for m in lines:
        rank, _, slab, touched, buffers, peak = (int(x) for x in m.groups())
        if not 0.9 * slab < touched <= slab or peak != touched + buffers:
            print('rank %d: slab %d, touched %d, buffers %d, peak %d' %
                  (rank, slab, touched, buffers, peak))
            return 1
    print('%d memory lines agree' % len(lines))
    return 0


sys.exit(main())
