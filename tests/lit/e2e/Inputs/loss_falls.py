"""loss_falls.py LOG STEPS FALL: the losses a training log prints. Fails (exit
1) when a step of 1..STEPS is missing, a loss is not finite, or the last loss
is not below FALL times the first; else prints 'loss falls' with both."""
import math
import re
import sys


def main():
    path, steps, fall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    loss = {}
    for line in open(path):
        m = re.match(r'step\s+(\d+)/\d+\s+loss\s+(\S+)', line)
        if m:
            loss[int(m.group(1))] = float(m.group(2))
    for s in range(1, steps + 1):
        if s not in loss or not math.isfinite(loss[s]):
            sys.exit('step %d: no finite loss in %s' % (s, path))
    if not loss[steps] < fall * loss[1]:
        sys.exit('the loss did not fall: %.6f -> %.6f' % (loss[1], loss[steps]))
    print('loss falls: %.6f -> %.6f in %d steps' % (loss[1], loss[steps], steps))


main()
