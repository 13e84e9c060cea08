"""keys.py FILE KEY...: FILE is JSON with every KEY; numbers are finite and
the step time, tokens/s and utilization positive."""
import json
import math
import sys

d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    if k not in d:
        sys.exit("missing key %s" % k)
for k in ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu"):
    if k in d and not (isinstance(d[k], (int, float)) and math.isfinite(d[k]) and d[k] > 0):
        sys.exit("%s = %r is not a positive number" % (k, d[k]))
if "mfu" in d and d["mfu"] > 1:
    sys.exit("MFU above 1: %r" % d["mfu"])
print("ok")
