#!/usr/bin/env python3
"""run_suites.py: run the test suites `make test` builds and count the results.

Reads build/unit/test_* (Criterion), tests/lit (lit + FileCheck on build/tcc-san)
and build/fuzz/fuzz_* (libFuzzer). Writes a line per suite and, last, the one
line `N passed, N failed` that sums every suite (also kept in
build/test-summary.txt); exits 1 when anything failed.

Counting: a unit test is one Criterion test; a test that passes but whose
process then reports a sanitizer error (a leak, found at exit) fails. A lit
test is one file. A fuzzer is one test that passes when its run ends without a
crash, leak, timeout or out-of-memory input.

    python3 tests/run_suites.py [--suites=unit,lit,fuzz] [--fuzz-seconds=30]
runs some of the suites on what was built last (make test builds first).
"""
import argparse
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, 'build')
LIT = '/usr/lib/llvm-14/build/utils/lit/lit.py'
SANITIZER_REPORT = re.compile(r'ERROR: (Address|Leak|Memory|Thread)Sanitizer|runtime error:')


def say(msg=''):
    print(msg, flush=True)


def rel(path):
    return os.path.relpath(path, ROOT)


class Tally:
    def __init__(self, name):
        self.name, self.passed, self.failed, self.skipped = name, 0, 0, 0
        self.failures = []

    def fail(self, what):
        self.failed += 1
        self.failures.append(what)

    def line(self, seconds):
        return '[%s] %d passed / %d failed / %d skipped (%.0f s)' % (
            self.name, self.passed, self.failed, self.skipped, seconds)


# ---- unit: Criterion binaries ----

def sanitizer_env():
    env = dict(os.environ)
    env['ASAN_OPTIONS'] = 'detect_leaks=1'
    env['UBSAN_OPTIONS'] = 'print_stacktrace=1'
    env['PATH'] = '/usr/lib/llvm-14/bin' + os.pathsep + env.get('PATH', '')  # llvm-symbolizer
    # the kernels the unit tests build: at -O1, faster to compile, the same bits (as lit.cfg.py)
    env.setdefault('TCC_KERNEL_CFLAGS', '-O1')
    # OpenMP's idle threads sleep instead of spinning against the other tests' (as lit.cfg.py)
    env.setdefault('GOMP_SPINCOUNT', '0')
    return env


def criterion_run(binary, tap_path, extra_args=()):
    """Run a Criterion binary; return (exit code, combined output, [(suite/test, status)]
    from its TAP report, or None when it wrote none)."""
    if os.path.exists(tap_path):
        os.remove(tap_path)
    cmd = [binary, '--tap=' + tap_path, '--timeout', '300'] + list(extra_args)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           env=sanitizer_env(), timeout=1800, cwd=ROOT)
        rc, out = p.returncode, p.stdout.decode('utf-8', 'replace')
    except subprocess.TimeoutExpired as e:
        rc, out = -1, (e.stdout or b'').decode('utf-8', 'replace') + '\n(timed out)\n'
    try:
        with open(tap_path, errors='replace') as f:
            tap = f.read()
    except OSError:
        return rc, out, None
    # Result lines start in column 0; assertion messages below them are indented.
    tests = []
    for m in re.finditer(r'^(ok|not ok) - (\S+)::(\S+)(.*)$', tap, re.M):
        status = 'FAILED' if m.group(1) == 'not ok' else 'PASSED'
        if status == 'PASSED' and '# SKIP' in m.group(4):
            status = 'SKIPPED'
        tests.append(('%s/%s' % (m.group(2), m.group(3)), status))
    return rc, out, tests


def synthesis_counts(out):
    """(passing, failing) from Criterion's last Synthesis line, or None."""
    m = re.findall(r'Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) '
                   r'\| Crashing: (\d+)', out)
    if not m:
        return None
    tested, passing, failing, crashing = map(int, m[-1])
    return passing, max(failing, tested - passing)


def run_unit_binary(tally, binary):
    name = os.path.basename(binary)
    rc, out, tests = criterion_run(binary, binary + '.tap')
    before = tally.failed
    isolated = []  # output of the tests rerun alone to find whose process leaked
    if tests is None:
        counts = synthesis_counts(out)
        if counts is None:
            tally.fail('%s (exit status %d, no report)' % (name, rc))
        else:
            tally.passed += counts[0]
            for _ in range(counts[1]):
                tally.fail('%s (see its output)' % name)
    else:
        leaky = SANITIZER_REPORT.search(out) is not None
        for test, status in tests:
            alone = sanitizer_after_pass(binary, test) if status == 'PASSED' and leaky else None
            if alone:
                tally.fail('%s %s (sanitizer report after it passed)' % (name, test))
                isolated.append('---- %s %s, run alone ----\n%s' % (name, test, alone))
            elif status == 'PASSED':
                tally.passed += 1
            elif status == 'SKIPPED':
                tally.skipped += 1
            else:
                tally.fail('%s %s (%s)' % (name, test, status.lower()))
        if rc != 0 and tally.failed == before:
            tally.fail('%s (exit status %d with every test passing)' % (name, rc))
    if tally.failed == before:
        say('PASS: unit :: %s' % name)
        return
    say('FAIL: unit :: %s' % name)
    say(out.rstrip())
    for text in isolated:
        say(text)


def sanitizer_after_pass(binary, test):
    """Run one test alone; its output when its process reported a sanitizer error."""
    rc, out, _ = criterion_run(binary, binary + '.one.tap', ['--filter', test])
    return out.rstrip() if SANITIZER_REPORT.search(out) else None


def suite_unit(args):
    tally = Tally('unit')
    sources = sorted(glob.glob(os.path.join(ROOT, 'tests', 'unit', 'test_*.c')))
    for src in sources:
        binary = os.path.join(BUILD, 'unit', os.path.basename(src)[:-2])
        if not os.access(binary, os.X_OK):
            tally.fail('%s (not built)' % rel(binary))
            say('FAIL: unit :: %s (not built)' % os.path.basename(binary))
            continue
        run_unit_binary(tally, binary)
    return tally


# ---- lit: golden tests ----

LIT_PASS = {'PASS', 'FLAKYPASS', 'XFAIL'}
LIT_SKIP = {'UNSUPPORTED', 'SKIPPED', 'EXCLUDED'}


def suite_lit(args):
    tally = Tally('lit')
    out_json = os.path.join(BUILD, 'lit', 'results.json')
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    if os.path.exists(out_json):
        os.remove(out_json)
    cmd = [sys.executable, LIT, '-v', os.path.join('tests', 'lit'), '-o', out_json,
           '--param', 'tcc=' + os.path.join(BUILD, 'tcc-san')]
    try:
        rc = subprocess.run(cmd, cwd=ROOT, timeout=1800).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    try:
        with open(out_json) as f:
            tests = json.load(f).get('tests', [])
    except (OSError, ValueError):
        tally.fail('lit (exit status %d, no results)' % rc)
        return tally
    for t in tests:
        if t['code'] in LIT_PASS:
            tally.passed += 1
        elif t['code'] in LIT_SKIP:
            tally.skipped += 1
        else:
            tally.fail('%s (%s)' % (t['name'], t['code'].lower()))
    return tally


# ---- fuzz: libFuzzer harnesses ----

def flat_name(prefix, path):
    return prefix + '_' + rel(path).replace(os.sep, '_')


def fill_corpus(corpus, files):
    os.makedirs(corpus, exist_ok=True)
    for path in files:
        shutil.copyfile(path, os.path.join(corpus, flat_name('seed', path)))


def ir_of_samples(corpus):
    """Seed the IR corpus with what the compiler prints for each sample."""
    tcc = os.path.join(ROOT, 'tcc')
    if not os.access(tcc, os.X_OK):
        return
    for sample in sorted(glob.glob(os.path.join(ROOT, 'samples', '*.tdl'))):
        for mesh in ([], ['--mesh', '8x4x2']):
            try:
                p = subprocess.run([tcc, sample, '--emit=ir'] + mesh, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, timeout=60, cwd=ROOT)
            except subprocess.TimeoutExpired:
                continue
            if p.returncode == 0 and p.stdout:
                tag = '_mesh' if mesh else ''
                name = flat_name('emit', sample)[:-4] + tag + '.tir'
                with open(os.path.join(corpus, name), 'wb') as f:
                    f.write(p.stdout)


def plans_of_samples(corpus):
    """Seed the plan corpus with small plans of the samples."""
    tcc = os.path.join(ROOT, 'tcc')
    os.makedirs(corpus, exist_ok=True)
    small = {'mlp': ['-D', 'B=4', '-D', 'I=3', '-D', 'H=5', '-D', 'C=2'],
             'gpt2': ['-D', 'V=8', '-D', 'S=4', '-D', 'D=4', '-D', 'H=1', '-D', 'L=1', '-D', 'B=8']}
    for name, defs in small.items():
        out = os.path.join(BUILD, 'fuzz', 'plan-' + name)
        try:
            p = subprocess.run([tcc, os.path.join(ROOT, 'samples', name + '.tdl'), '--emit=plan',
                                '-o', out] + defs, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60, cwd=ROOT)
        except (subprocess.TimeoutExpired, OSError):
            continue
        if p.returncode == 0:
            shutil.copyfile(os.path.join(out, 'plan.json'),
                            os.path.join(corpus, 'seed_plan_' + name + '.json'))


def npy_seeds(corpus):
    """Seed the .npy corpus with small files the loader accepts (fuzz_npy's
    f32 examples [2, 3] and i32 examples [3] in [0, 5)), in versions 1 and 2."""
    os.makedirs(corpus, exist_ok=True)
    arrays = [('<f4', '(4, 2, 3)', struct.pack('<24f', *[0.5 * i for i in range(24)])),
              ('<i4', '(3, 3)', struct.pack('<9i', *[i % 5 for i in range(9)]))]
    for version in (1, 2):
        for descr, shape, body in arrays:
            head = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
            pre = 8 + (2 if version == 1 else 4)
            head += ' ' * (63 - (pre + len(head)) % 64) + '\n'
            size = struct.pack('<H' if version == 1 else '<I', len(head))
            data = b'\x93NUMPY' + bytes([version, 0]) + size + head.encode() + body
            name = 'seed_v%d_%s.npy' % (version, descr[1:])
            with open(os.path.join(corpus, name), 'wb') as f:
                f.write(data)


def prepare_corpora():
    fuzz_dir = os.path.join(ROOT, 'tests', 'fuzz')
    npy_seeds(os.path.join(fuzz_dir, 'corpus_npy'))
    plans_of_samples(os.path.join(fuzz_dir, 'corpus_plan'))
    tdl = glob.glob(os.path.join(ROOT, 'samples', '*.tdl'))
    tdl += glob.glob(os.path.join(ROOT, 'tests', 'lit', '**', '*.tdl'), recursive=True)
    fill_corpus(os.path.join(fuzz_dir, 'corpus_tdl'), sorted(tdl))
    tir = [p for p in glob.glob(os.path.join(ROOT, 'tests', '**', '*.tir'), recursive=True)
           if not rel(p).startswith(os.path.join('tests', 'fuzz', 'corpus_'))]
    fill_corpus(os.path.join(fuzz_dir, 'corpus_ir'), sorted(tir))
    ir_of_samples(os.path.join(fuzz_dir, 'corpus_ir'))


# Where each fuzzer's dictionary takes its words: the identifier-like string
# literals of the sources that read its input (keywords, op, dtype, role names).
DICT_SOURCES = {
    'fuzz_tdl': ['frontend/lexer.l', 'frontend/parser.y', 'frontend/*.c', 'ir/ops.def'],
    'fuzz_ir': ['ir/*.c', 'ir/ops.def'],
    'fuzz_plan': ['plan/json_read.c', 'plan/json_write.c', 'plan/check.c', 'plan/basics.c',
                  'plan/plan_impl.h'],
    'fuzz_npy': ['runtime/npy.c'],
}
# Punctuation, written as libFuzzer's dictionary format spells it.
DICT_EXTRA = {
    'fuzz_tdl': ['@', '@(', '[', ']', '{', '}', '=', ':', ',', '#', '\\x0a', '    '],
    'fuzz_ir': ['%', '@', '@(', '[', ']', '{', '}', '=', ':', ',', '#', '\\"', '\\x0a'],
    'fuzz_plan': ['{', '}', '[', ']', ':', ',', '\\"', '-1', '1e308', '0.5'],
    'fuzz_npy': ['\\x93NUMPY\\x01\\x00', '\\x93NUMPY\\x02\\x00', "'descr': '<f4'", "'descr': '<i4'",
                 "'fortran_order': False", "'shape': (", ', ', ')', '}', '\\x0a'],
}


def write_dict(name):
    """build/fuzz/NAME.dict from the sources that read the fuzzer's input; its path."""
    words = set()
    for pattern in DICT_SOURCES[name]:
        for path in glob.glob(os.path.join(ROOT, pattern)):
            with open(path, errors='replace') as f:
                words.update(re.findall(r'"([A-Za-z_][A-Za-z0-9_]{1,31})"', f.read()))
    path = os.path.join(BUILD, 'fuzz', name + '.dict')
    with open(path, 'w') as f:
        for w in sorted(words) + DICT_EXTRA[name]:
            f.write('"%s"\n' % w)
    return path


def start_fuzzer(name, seconds):
    binary = os.path.join(BUILD, 'fuzz', name)
    corpus = os.path.join(ROOT, 'tests', 'fuzz', 'corpus_' + name[len('fuzz_'):])
    artifacts = os.path.join(BUILD, 'fuzz', 'artifacts')
    os.makedirs(artifacts, exist_ok=True)
    max_len = 65536 if name == 'fuzz_plan' else 4096  # a small plan is a few kB
    cmd = [binary, '-max_total_time=%d' % seconds, '-max_len=%d' % max_len, '-timeout=5',
           '-rss_limit_mb=2048', '-print_final_stats=1',
           '-artifact_prefix=%s/%s-' % (artifacts, name)]
    cmd += ['-dict=' + write_dict(name), corpus]
    log = open(os.path.join(BUILD, 'fuzz', name + '.log'), 'w')
    env = sanitizer_env()
    env.pop('ASAN_OPTIONS')  # libFuzzer sets leak detection itself
    before = set(os.listdir(artifacts))
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return {'name': name, 'proc': p, 'log': log, 'corpus': corpus, 'binary': binary,
            'artifacts': artifacts, 'before': before}


def finish_fuzzer(tally, run, seconds):
    name, p = run['name'], run['proc']
    try:
        rc = p.wait(timeout=seconds + 300)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    run['log'].close()
    with open(run['log'].name, errors='replace') as f:
        text = f.read()
    new = sorted(set(os.listdir(run['artifacts'])) - run['before'])
    done = re.findall(r'^Done \d+ runs in \d+ second\(s\)', text, re.M)
    size = len(os.listdir(run['corpus']))
    if rc == 0 and done and not new:
        tally.passed += 1
        say('PASS: fuzz :: %s: %s, corpus %d inputs' % (name, done[-1], size))
        return
    tally.fail('%s (exit status %d)' % (name, rc))
    say('FAIL: fuzz :: %s (exit status %d); the end of %s:' % (name, rc, rel(run['log'].name)))
    say('\n'.join(text.rstrip().split('\n')[-80:]))
    for artifact in new:
        say('reproduce: %s %s' % (rel(run['binary']), rel(os.path.join(run['artifacts'],
                                                                       artifact))))


def suite_fuzz(args):
    tally = Tally('fuzz')
    names = ['fuzz_tdl', 'fuzz_ir', 'fuzz_plan', 'fuzz_npy']
    missing = [n for n in names if not os.access(os.path.join(BUILD, 'fuzz', n), os.X_OK)]
    for n in missing:
        tally.fail('%s (not built)' % n)
        say('FAIL: fuzz :: %s (not built)' % n)
    prepare_corpora()
    say('fuzzing %s for %d s each, side by side' % (', '.join(names), args.fuzz_seconds))
    runs = [start_fuzzer(n, args.fuzz_seconds) for n in names if n not in missing]
    for run in runs:
        finish_fuzzer(tally, run, args.fuzz_seconds)
    return tally


SUITES = {'unit': suite_unit, 'lit': suite_lit, 'fuzz': suite_fuzz}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--suites', default='unit,lit,fuzz', help='comma-separated: unit,lit,fuzz')
    ap.add_argument('--fuzz-seconds', type=int, default=30, help='time per fuzzer')
    args = ap.parse_args()
    start = time.time()
    tallies = []
    for name in args.suites.split(','):
        if name not in SUITES:
            ap.error('unknown suite %r' % name)
        say('==== %s ====' % name)
        t0 = time.time()
        tallies.append((SUITES[name](args), time.time() - t0))
    say('==== summary ====')
    for tally, seconds in tallies:
        say(tally.line(seconds))
        for what in tally.failures:
            say('  failed: %s' % what)
    passed = sum(t.passed for t, _ in tallies)
    failed = sum(t.failed for t, _ in tallies)
    say('all suites: %.0f s' % (time.time() - start))
    summary = '%d passed, %d failed' % (passed, failed)
    os.makedirs(BUILD, exist_ok=True)
    with open(os.path.join(BUILD, 'test-summary.txt'), 'w') as f:
        f.write(summary + '\n')
    say(summary)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
