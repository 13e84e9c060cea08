# lit.cfg.py: how lit runs the golden tests under tests/lit.
# Each .tdl, .tir or .test file carries RUN: lines in comments; they run in lit's
# own shell with these substitutions:
#   %tcc        the sanitized compiler (build/tcc-san; --param tcc=PATH for another)
#   %tccdata    the project's ./tccdata (make tccdata)
#   %tccnvrtc   the project's ./tccnvrtc (built with the CUDA toolkit only)
#   %FileCheck  llvm-14's FileCheck (plain `FileCheck` and `not` work too)
#   %samples    the absolute path of samples/
#   %root       the project's root (scripts/, build/)
#   %oclcheck   build/oclcheck (tests/kernels/oclcheck.c); feature `opencl` when an
#               OpenCL platform is installed (an ICD file in /etc/OpenCL/vendors)
#   %numpy      a python3 that imports NumPy (Debian's python3-numpy, scripts/deps.sh),
#               to write .npy files as NumPy itself does; feature `numpy`
# Sanitizer errors abort, so `not %tcc` fails on a crash instead of passing.
# Features: `cuda` when the CUDA toolkit is there ($CUDA_HOME, default
# /usr/local/cuda, as the Makefile finds it): tests of the CUDA kernels say
# `REQUIRES: cuda`. They need no GPU: NVRTC compiles anywhere.
import glob
import os

import lit.formats

config.name = 'tcc'
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = ['.tdl', '.tir', '.test']
config.excludes = ['Inputs']

root = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.test_exec_root = os.path.join(root, 'build', 'lit')

llvm_bin = '/usr/lib/llvm-14/bin'
tcc = os.path.abspath(lit_config.params.get('tcc', os.path.join(root, 'build', 'tcc-san')))
if not os.access(tcc, os.X_OK):
    lit_config.fatal('no compiler at %s: run make first' % tcc)

config.environment['PATH'] = os.pathsep.join([llvm_bin, config.environment.get('PATH', '')])
config.environment['ASAN_OPTIONS'] = 'detect_leaks=1:abort_on_error=1'
config.environment['UBSAN_OPTIONS'] = 'print_stacktrace=1:abort_on_error=1'
config.environment['LSAN_OPTIONS'] = 'abort_on_error=1'
# The kernels build at -O1 (after the runtime's -O3): 4-5 times faster to
# compile, the same bits (no level reassociates or contracts; docs/plan.md).
# Speed is measured by the benchmarks, at the default.
config.environment['TCC_KERNEL_CFLAGS'] = os.environ.get('TCC_KERNEL_CFLAGS', '-O1')
# OpenMP's threads sleep when they wait instead of spinning: a mesh's ranks
# run as threads, each with its own team, on few cores, and spinning teams
# starve the ranks that have work (gpt2 --verify on 2x2x2: 11.6 s, 5.4 s so).
# How threads wait changes no result.
config.environment['GOMP_SPINCOUNT'] = os.environ.get('GOMP_SPINCOUNT', '0')
# Diagnostics are compared as text: no color, no locale surprises.
config.environment['LC_ALL'] = 'C'
config.environment.pop('TERM', None)

cuda_home = os.environ.get('CUDA_HOME', '/usr/local/cuda')
if os.path.exists(os.path.join(cuda_home, 'include', 'nvrtc.h')):
    config.available_features.add('cuda')

# These run before lit's own %s, %S, %t..., so %tcc and %samples win over %t and %s;
# %tccdata and %tccnvrtc come before %tcc, which is a prefix of them.
config.substitutions.append(('%tccdata', os.path.join(root, 'tccdata')))
config.substitutions.append(('%tccnvrtc', os.path.join(root, 'tccnvrtc')))
config.substitutions.append(('%tcc', tcc))
config.substitutions.append(('%FileCheck', os.path.join(llvm_bin, 'FileCheck')))
config.substitutions.append(('%samples', os.path.join(root, 'samples')))
config.substitutions.append(('%root', root))
config.substitutions.append(('%oclcheck', os.path.join(root, 'build', 'oclcheck')))
if glob.glob('/etc/OpenCL/vendors/*.icd'):
    config.available_features.add('opencl')

# The first python3 that imports NumPy: the system's, where pyenv or a venv
# shadows it on the PATH.
import subprocess
for py in ['/usr/bin/python3', 'python3']:
    try:
        subprocess.run([py, '-c', 'import numpy'], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        continue
    config.available_features.add('numpy')
    config.substitutions.append(('%numpy', py))
    break
