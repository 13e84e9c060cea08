"""Two --emit=memory JSON files (recompute none, then full): the share of the
bytes a microbatch's forward saves for its backward that full keeps, in all
and in the layers, and whether the activations at the peak differ."""
import json
import sys

none, full = (json.load(open(p))["stages"][0] for p in sys.argv[1:3])
r = full["saved_per_microbatch"] / none["saved_per_microbatch"]
print("forward keeps %.4f of none: %s" % (r, "at most a quarter" if r <= 0.25 else "more"))
r = full["saved_in_layers"] / none["saved_in_layers"]
print("layers keep %.4f of none: %s" % (r, "at most a quarter" if r <= 0.25 else "more"))
print("activations at the peak %d and %d: %s" % (
    none["activations"], full["activations"],
    "differ" if none["activations"] > full["activations"] else "same"))
