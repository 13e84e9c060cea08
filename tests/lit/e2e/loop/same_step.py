"""same_step.py TCC OUTDIR NAME TCC-ARGS...: the microbatch loop against the
unrolled step. Builds the program twice, as compiled (one microbatch's
instructions run by the schedule table) and with TCC_TEST_UNROLL=1 (every
microbatch a copy in the graph, summed by adds), runs 3 steps of each with
--exact and a checkpoint, and prints 'NAME: same losses, N tensors
identical' when the logged losses and gradient norms (hex floats) and every
parameter and optimizer state byte agree; else names the difference and
exits 1."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(tcc, out, name, args, unroll):
    env = dict(os.environ)
    if unroll:
        env['TCC_TEST_UNROLL'] = '1'
    prog = os.path.join(out, name + ('-unrolled' if unroll else '-loop'))
    subprocess.run([tcc] + args + ['-o', prog], check=True, env=env)
    ckpt = prog + '.ckpt'
    log = subprocess.run([prog, '--steps', '3', '--exact', '--ckpt', ckpt], check=True,
                         capture_output=True, text=True).stdout
    lines = [l.split('  ')[:4] for l in log.splitlines() if l.startswith('step ') and 'loss' in l]
    return lines, os.path.join(ckpt, 'step-00000003.safetensors')


def main():
    tcc, out, name, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    loop, ck_loop = run(tcc, out, name, args, False)
    unrolled, ck_unrolled = run(tcc, out, name, args, True)
    if len(loop) != 3 or loop != unrolled:
        print('%s: the losses differ:\n  loop     %s\n  unrolled %s' % (name, loop, unrolled))
        return 1
    same = subprocess.run([sys.executable, os.path.join(HERE, '..', '..', 'recompute',
                                                        'same_tensors.py'), ck_loop, ck_unrolled],
                          capture_output=True, text=True)
    if same.returncode:
        print('%s: %s' % (name, same.stderr.strip() or same.stdout.strip()))
        return 1
    print('%s: same losses, %s' % (name, same.stdout.strip()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
