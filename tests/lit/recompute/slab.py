"""slab.py NONE SELECTIVE FULL: the slab bytes of three `tcc --emit=memory`
reports (the number on the line that starts with 'slab'), printed in order
and then whether full < selective < none."""
import re
import sys


def slab(path):
    for line in open(path):
        m = re.match(r'\s*slab\D*([\d,]+)', line)
        if m:
            return int(m.group(1).replace(',', ''))
    sys.exit('%s: no slab line' % path)


none, sel, full = (slab(p) for p in sys.argv[1:4])
print('slab none %d selective %d full %d' % (none, sel, full))
print('full < selective < none' if full < sel < none else 'NOT full < selective < none')
