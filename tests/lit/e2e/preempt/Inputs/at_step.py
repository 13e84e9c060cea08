"""at_step.py DIR DELTA -- COMMAND...: run COMMAND with every '{}' in it
replaced by the step of DIR's newest checkpoint plus DELTA (for a run that
must end a few steps after the step an interrupted run stopped at)."""
import os
import re
import sys

NAME = re.compile(r'^step-(\d+)\.safetensors$')


def main():
    folder, delta, sep, command = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    assert sep == '--' and command, __doc__
    steps = [int(m.group(1)) for m in map(NAME.match, os.listdir(folder)) if m]
    if not steps:
        print('at_step.py: no checkpoint in %s' % folder, file=sys.stderr)
        return 1
    step = str(max(steps) + delta)
    command = [a.replace('{}', step) for a in command]
    os.execvp(command[0], command)


sys.exit(main())
