"""saved_per_layer.py A.json B.json LA LB S B: the bytes per s*b*h that one
layer's forward saves for its backward, from two --emit=memory JSON files of
one model with LA and LB layers (stage 0's saved_in_layers: what a
microbatch's forward keeps inside its layers), s the sequence, b the
microbatch's batch and h the hidden size (given as S B H, multiplied here).
Prints 'saved per layer: X sbh bytes'."""
import json
import sys


def saved(path):
    return json.load(open(path))["stages"][0]["saved_in_layers"]


def main():
    a, b = saved(sys.argv[1]), saved(sys.argv[2])
    la, lb = int(sys.argv[3]), int(sys.argv[4])
    sbh = int(sys.argv[5]) * int(sys.argv[6]) * int(sys.argv[7])
    print("saved per layer: %.1f sbh bytes" % ((b - a) / (lb - la) / sbh))


if __name__ == "__main__":
    main()
