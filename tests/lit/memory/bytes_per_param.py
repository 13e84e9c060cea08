"""Bytes of training state a parameter, from `tcc --emit=memory`, against a
formula. usage: bytes_per_param.py TCC WANT TOL NPARAMS TCC-ARGS...
NPARAMS is the model's parameter count, computed by the test from its shape
(not read from tcc). Prints parameters, gradients, optimizer state and their
total over NPARAMS, and whether the total is within TOL (relative) of WANT;
exits 1 when it is not."""
import re
import subprocess
import sys

tcc, want, tol, n = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
out = subprocess.run([tcc] + sys.argv[5:] + ['--emit=memory'], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit('tcc failed: ' + out.stderr)
got = {}
for key in ('parameters', 'gradients', 'optimizer state', 'training state'):
    m = re.search(r'^  %s +(\d+) bytes$' % key, out.stdout, re.M)
    if not m:
        sys.exit('no "%s" line in:\n%s' % (key, out.stdout))
    got[key] = int(m.group(1)) / n
rel = got['training state'] / want - 1
print('params %.2f grads %.2f optimizer %.2f: %.2f bytes a parameter against %.2f: %+.1f%%, %s' %
      (got['parameters'], got['gradients'], got['optimizer state'], got['training state'], want,
       100 * rel, 'within %g' % tol if abs(rel) <= tol else 'OUTSIDE %g' % tol))
sys.exit(0 if abs(rel) <= tol else 1)
