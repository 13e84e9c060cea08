"""environ.py PROGRAM: start PROGRAM (a trainer, for many steps), read the
environment it runs with once it has started itself again, stop it, and
print its OpenMP and OpenBLAS variables, sorted."""
import subprocess
import sys
import time

p = subprocess.Popen([sys.argv[1], "--steps", "100000000"], stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL)
p.stdout.readline()  # its first log line: past the exec, into the steps
env = open("/proc/%d/environ" % p.pid, "rb").read().split(b"\0")
p.kill()
p.wait()
keys = (b"OMP_", b"GOMP_", b"OPENBLAS_")
for v in sorted(e for e in env if e.startswith(keys)):
    print(v.decode())
