"""exit_within.py SECONDS OUT ERR -- CMD...: runs CMD, its stdout into OUT and
its stderr into ERR, and prints "exit N within SECONDS s" when it ends in time,
else "exit N after T s, more than SECONDS" (N: its exit status). CMD is killed
after 4 x SECONDS (then N is -9): a command that hangs fails the check instead
of the test run. Exit status 0 (the verdict is the printed line)."""
import subprocess
import sys
import time


def main():
    limit, out, err = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    cmd = sys.argv[sys.argv.index('--') + 1:]
    t0 = time.monotonic()
    with open(out, 'w') as o, open(err, 'w') as e:
        p = subprocess.Popen(cmd, stdout=o, stderr=e, start_new_session=True)
        try:
            rc = p.wait(timeout=4 * limit)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
    took = time.monotonic() - t0
    if took <= limit:
        print('exit %d within %g s' % (rc, limit))
    else:
        print('exit %d after %.1f s, more than %g' % (rc, took, limit))
    return 0


if __name__ == '__main__':
    sys.exit(main())
