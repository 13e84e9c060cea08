"""slab.py NONE SELECTIVE FULL: the slab bytes of three `tcc --emit=memory`
-plan` reports (the number after 'slab' on stage 0's line), printed in order
and then whether full < selective < none."""
import re
import sys


def slab(path):
    for line in open(path):
        m = re.search(r'slab (\d+) bytes', line)
        if m:
            return int(m.group(1).replace(',', ''))
    sys.exit('%s: no slab line' % path)


none, sel, full = (slab(p) for p in sys.argv[1:4])
print('slab none %d selective %d full %d' % (none, sel, full))
print('full < selective < none' if full < sel < none else 'NOT full < selective < none')
