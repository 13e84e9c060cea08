"""metrics_check.py METRICS.jsonl LOG STEPS [VAL_EVERY]: the --metrics file
is one JSON object a line: a line per training step 1..STEPS in order, with
the keys a step has and the loss, lr and grad norm the log printed for it
(to its 6 and 3 and 4 decimals), and, given VAL_EVERY, a validation loss at
every VAL_EVERY steps equal to the log's. Prints one line; exits 1 on the
first mismatch."""
import json
import re
import sys

path, log, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
val_every = int(sys.argv[4]) if len(sys.argv) > 4 else 0
lines = [json.loads(l) for l in open(path)]
train = [l for l in lines if 'loss' in l]
vals = [l for l in lines if 'val_loss' in l]
logged = {}
vlogged = {}
for l in open(log):
    m = re.match(r'step +(\d+)/\d+  loss ([0-9.]+)  lr ([0-9.e+-]+)  grad norm ([0-9.]+)', l)
    if m:
        logged[int(m.group(1))] = tuple(float(x) for x in m.group(2, 3, 4))
    m = re.match(r'step +(\d+)  val loss ([0-9.]+)', l)
    if m:
        vlogged[int(m.group(1))] = float(m.group(2))


def bad(msg):
    print('metrics: ' + msg)
    sys.exit(1)


if [l['step'] for l in train] != list(range(1, steps + 1)):
    bad('steps %s, expected 1..%d' % ([l['step'] for l in train], steps))
for l in train:
    for k in ('steps', 'loss', 'lr', 'grad_norm', 'ms', 'tokens_per_s', 'gflops'):
        if k not in l:
            bad('step %d has no %s' % (l['step'], k))
    if l['step'] in logged:
        loss, lr, norm = logged[l['step']]
        if round(l['loss'], 6) != loss or float('%.3e' % l['lr']) != lr or round(l['grad_norm'], 4) != norm:
            bad('step %d: %s against the log %s' % (l['step'], l, logged[l['step']]))
if val_every:
    if [v['step'] for v in vals] != list(range(val_every, steps + 1, val_every)):
        bad('validation at %s' % [v['step'] for v in vals])
    for v in vals:
        if round(v['val_loss'], 6) != vlogged.get(v['step']):
            bad('validation at %d: %s against the log %s' % (v['step'], v['val_loss'], vlogged.get(v['step'])))
print('metrics match the log: %d steps, %d validations' % (len(train), len(vals)))
