"""same_tensors.py A.safetensors B.safetensors [RTOL]: two checkpoints hold the
same tensors: the same names, dtypes and shapes, and values whose largest
difference is at most RTOL (default 1e-12) times the largest magnitude of A's
tensor. Prints each tensor as "name [shape] dtype" in name order, then
"N tensors agree; metadata differs in: KEYS", or what does not agree (exit 1)."""
import json
import struct
import sys

FORMATS = {'F64': 'd', 'F32': 'f', 'I32': 'i'}


def read(path):
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(n))
        return header, f.read()


def values(entry, data):
    b, e = entry['data_offsets']
    fmt = FORMATS[entry['dtype']]
    return struct.unpack('<%d%s' % ((e - b) // struct.calcsize(fmt), fmt), data[b:e])


def main():
    (ha, da), (hb, db) = read(sys.argv[1]), read(sys.argv[2])
    rtol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-12
    ma, mb = ha.pop('__metadata__'), hb.pop('__metadata__')
    if sorted(ha) != sorted(hb):
        print('other tensors: %s and %s' % (sorted(ha), sorted(hb)))
        return 1
    for name in sorted(ha):
        a, b = ha[name], hb[name]
        if (a['dtype'], a['shape']) != (b['dtype'], b['shape']):
            print('%s: %s %s and %s %s' % (name, a['dtype'], a['shape'], b['dtype'], b['shape']))
            return 1
        x, y = values(a, da), values(b, db)
        scale = max([abs(v) for v in x] + [0.0])
        worst = max([abs(u - v) for u, v in zip(x, y)] + [0.0])
        if worst > rtol * scale:
            print('%s: differs by %g, more than %g of %g' % (name, worst, rtol, scale))
            return 1
        print('%s %s %s' % (name, a['shape'], a['dtype']))
    keys = sorted(k for k in ma if ma.get(k) != mb.get(k))
    print('%d tensors agree; metadata differs in: %s' % (len(ha), ', '.join(keys) or 'nothing'))
    return 0


sys.exit(main())
