"""Check --emit=memory -o FILE.json: every stage has the categories, they
sum to its peak, the device's peak is the largest stage's; print each
stage's share of the one-device numbers when a second file is given.

usage: check_json.py MESH.json STAGES [ONE.json]"""
import json
import sys

KEYS = ["params", "grads", "optimizer", "activations", "temporaries", "comm", "workspace",
        "reserved"]


def main():
    m = json.load(open(sys.argv[1]))
    stages = m["stages"]
    assert len(stages) == int(sys.argv[2]), "%d stages" % len(stages)
    for s in stages:
        total = sum(s[k] for k in KEYS)
        assert abs(total - s["peak"]) <= 1, "stage %d: categories %d, peak %d" % (
            s["stage"], total, s["peak"])
        assert s["largest"] and all(t["bytes"] > 0 for t in s["largest"])
    peak = max(s["peak"] for s in stages)
    assert m["peak"] == peak and stages[m["peak_stage"]]["peak"] == peak
    print("%d stages: categories sum to each peak; device peak is stage %d's" % (
        len(stages), m["peak_stage"]))
    if len(sys.argv) > 3:
        one = json.load(open(sys.argv[3]))["stages"][0]
        for s in stages:
            print("stage %d: params %.2f, optimizer %.2f of one device's, %d in flight" % (
                s["stage"], s["params"] / one["params"], s["optimizer"] / one["optimizer"],
                s["inflight"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
