"""plan_size.py A.json B.json TOL: two plans of one model that differ in their
microbatches: their counts, instructions, and the ratio of their sizes in
bytes, which must be within 1 + TOL. Exits 1 when it is not, or when the
instruction counts differ."""
import json
import os
import sys

a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
pa, pb = json.load(open(a)), json.load(open(b))
sa, sb = os.path.getsize(a), os.path.getsize(b)
ratio = max(sa, sb) / min(sa, sb)
ok = ratio <= 1 + tol and len(pa['instrs']) == len(pb['instrs'])
print('microbatches %d and %d: %s %d instructions; plan sizes %d and %d bytes, ratio %.4f: %s %.2f'
      % (pa.get('microbatches', 1), pb.get('microbatches', 1),
         'the same' if len(pa['instrs']) == len(pb['instrs']) else 'NOT the same',
         len(pa['instrs']), sa, sb, ratio, 'within' if ok else 'over', tol))
sys.exit(0 if ok else 1)
