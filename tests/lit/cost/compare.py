"""compare.py A.json OP B.json KEY [FACTOR]: A[KEY] OP FACTOR * B[KEY] (OP: > or <;
FACTOR 1 when absent), else exit 1 with both values."""
import json
import sys

a, op, b, key = sys.argv[1:5]
f = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
x, y = json.load(open(a))[key], json.load(open(b))[key]
ok = x > f * y if op == ">" else x < f * y
print("%s: %g %s %g x %g: %s" % (key, x, op, f, y, "ok" if ok else "NO"))
sys.exit(0 if ok else 1)
