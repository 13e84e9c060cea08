"""The first step's loss of a program's log (its --exact hex float) against
the "reference loss X" line of another file, relative to the reference.
usage: loss_vs_ref.py LOG REF TOL"""
import re
import sys

log, ref, tol = open(sys.argv[1]).read(), open(sys.argv[2]).read(), float(sys.argv[3])
m = re.search(r"^step +1/\d+ +loss \S+ \((\S+)\)", log, re.M)
r = re.search(r"reference loss (\S+)", ref)
if not m or not r:
    sys.exit("no step-1 loss in the log, or no reference")
got, want = float.fromhex(m.group(1)), float(r.group(1))
rel = abs(got - want) / abs(want)
print("step 1 loss %.9f against the float64 reference %.9f: %s" %
      (got, want, "within %g" % tol if rel <= tol else "OFF by %.3g" % rel))
sys.exit(0 if rel <= tol else 1)
