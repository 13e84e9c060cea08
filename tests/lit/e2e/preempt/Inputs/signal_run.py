"""signal_run.py [options] LOG -- COMMAND...: run COMMAND (stdout and stderr
into LOG), wait until LOG shows a training step >= --after, send it --signal,
wait for it to end, and print how it ended ("exit 143", "killed by SIGTERM").

No sleep assumes a speed: LOG is polled until the step appears, however long
the machine takes, and the command must run more steps than the poll can miss
(a large --steps); the run gives up only after --timeout seconds.

  --after N         the step to wait for (default 3)
  --signal NAME     TERM, INT or USR1 (default TERM)
  --pids DIR        the command is mpirun, each rank started through
                    `sh -c 'echo $$ > DIR/pid.$OMPI_COMM_WORLD_RANK; exec ...'`:
  --rank R          send the signal to rank R's process only (default 0)
  --freeze R        first stop rank R (SIGSTOP): the others wait for it in
                    their next collective and cannot finish the step
  --twice           once the target has handled the first signal (its handler
                    is gone from /proc/PID/status SigCgt), send a second one
  --ckpt DIR        then print whether DIR holds the checkpoint of the step
                    the log says the run stopped after"""
import os
import re
import signal
import subprocess
import sys
import time

STEP = re.compile(r'^step +(\d+)/', re.M)
STOPPED = re.compile(r'stopped by SIG[A-Z0-9]+ after step (\d+)')


def option(args, name, default):
    if name in args:
        i = args.index(name)
        value = args[i + 1]
        del args[i:i + 2]
        return value
    return default


def wait_for(what, deadline, proc):
    """Poll what() until it returns something; None when proc ended or time ran out."""
    while time.time() < deadline:
        got = what()
        if got is not None:
            return got
        if proc.poll() is not None:
            return what()
        time.sleep(0.01)
    return None


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ''


def last_step(log):
    steps = [int(m) for m in STEP.findall(read(log))]
    return max(steps) if steps else -1


def caught(pid, sig):
    """Whether pid still has a handler for sig (None when it is gone)."""
    for line in read('/proc/%d/status' % pid).splitlines():
        if line.startswith('SigCgt:'):
            return (int(line.split()[1], 16) >> (sig - 1)) & 1
    return None


def rank_pid(pids, rank, deadline, proc):
    path = os.path.join(pids, 'pid.%d' % rank)
    text = wait_for(lambda: read(path).strip() or None, deadline, proc)
    return int(text) if text else None


def main():
    args = sys.argv[1:]
    after = int(option(args, '--after', '3'))
    sig = getattr(signal, 'SIG' + option(args, '--signal', 'TERM'))
    pids = option(args, '--pids', None)
    rank = int(option(args, '--rank', '0'))
    freeze = option(args, '--freeze', None)
    ckpt = option(args, '--ckpt', None)
    timeout = float(option(args, '--timeout', '600'))
    twice = '--twice' in args
    if twice:
        args.remove('--twice')
    log, sep, command = args[0], args[1], args[2:]
    assert sep == '--' and command, __doc__
    deadline = time.time() + timeout
    with open(log, 'w') as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        return drive(proc, log, after, sig, pids, rank, freeze, twice, ckpt, deadline)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def drive(proc, log, after, sig, pids, rank, freeze, twice, ckpt, deadline):
    if wait_for(lambda: True if last_step(log) >= after else None, deadline, proc) is None:
        print('the run ended or timed out before step %d' % after)
        return 1
    target = rank_pid(pids, rank, deadline, proc) if pids else proc.pid
    if freeze is not None:
        os.kill(rank_pid(pids, int(freeze), deadline, proc), signal.SIGSTOP)
    os.kill(target, sig)
    if twice:
        if wait_for(lambda: True if caught(target, sig) == 0 else None, deadline, proc) is None:
            print('the first signal was not handled')
            return 1
        os.kill(target, sig)
    try:
        code = proc.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        print('no end within the timeout')
        return 1
    print('exit %d' % code if code >= 0 else 'killed by %s' % signal.Signals(-code).name)
    stopped = STOPPED.search(read(log))
    if ckpt and stopped:
        step = int(stopped.group(1))
        path = os.path.join(ckpt, 'step-%08d.safetensors' % step)
        print('stopped after step %d, checkpoint %s' %
              (step, 'present' if os.path.exists(path) else 'missing'))
    return 0


sys.exit(main())
