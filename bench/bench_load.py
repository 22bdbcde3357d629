#!/usr/bin/env python3
"""Model load time and peak memory, kiln vs llama.cpp, with a warm and a cold page cache.

Each load is a fresh process: kiln's `load_bench MODEL 1 mmap` (kiln::Model::Load: parse,
tokenizer, weight binding and the interleaved copies, which for the nibble types at AVX-512 are
written in the background after Load returns: the "ready" column waits for them too, and the
process's peak RSS includes them) and llama.cpp's `llama_load_peer`
(bench/llama_load_peer.cc: llama_model_load_from_file with its defaults: mmap, ggml's CPU
repacking), compiled here against the llama.cpp that bench/build_llama_cpp.sh builds into the
cache. Both time the load inside the process; the process's peak RSS comes from wait4.
  warm: the file read once just before, so its pages are in the page cache;
  cold: its pages dropped first (posix_fadvise DONTNEED, checked with fincore where present),
        so the load reads the file from the disk.
The sides alternate which goes first from repeat to repeat.

Usage: python3 bench/bench_load.py [--model A.gguf ...] [--build build] [--repeats 10]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get('KILN_CACHE_DIR', os.path.expanduser('~/.cache/kiln'))


def fmt(xs, prec=1):
    return f'{statistics.median(xs):.{prec}f} ({min(xs):.{prec}f}-{max(xs):.{prec}f})'


def build_peer():
    """llama_load_peer, compiled against the cached llama.cpp build (rebuilt when older)."""
    bin_dir = subprocess.run([os.path.join(HERE, 'build_llama_cpp.sh')], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    root = os.path.dirname(os.path.dirname(bin_dir))  # .../llama.cpp-VERSION
    src = os.path.join(HERE, 'llama_load_peer.cc')
    exe = os.path.join(root, 'llama_load_peer')
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(src):
        return exe
    vendor = os.path.join(root, 'src', 'vendor', 'llama.cpp')
    libs = [os.path.join(root, 'build', p) for p in (
        'src/libllama.a', 'ggml/src/libggml.a', 'ggml/src/libggml-cpu.a',
        'ggml/src/libggml-base.a')]
    subprocess.run(['g++', '-O2', '-std=c++17', '-I', os.path.join(vendor, 'include'), '-I',
                    os.path.join(vendor, 'ggml', 'include'), src, '-o', exe, *libs, '-fopenmp',
                    '-lpthread', '-ldl'], check=True)
    return exe


def resident_bytes(path):
    if not shutil.which('fincore'):
        return None
    out = subprocess.run(['fincore', '--bytes', '--noheadings', '--output', 'RES', path],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def make_cold(path):
    with open(path, 'rb') as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def make_warm(path):
    with open(path, 'rb') as f:
        while f.read(1 << 24):
            pass


def run(cmd, patterns):
    """([ms parsed by each pattern], peak RSS in MiB) of one process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f'{cmd[0]} failed ({proc.returncode}):\n{out}')
    return [float(re.search(p, out).group(1)) for p in patterns], usage.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', action='append')
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--repeats', type=int, default=10)
    args = ap.parse_args()
    models = args.model or [p for p in (
        os.path.join(CACHE, 'SmolLM2-135M-Instruct.Q4_1.gguf'),
        os.path.join(CACHE, 'gemma-3-270m-q4_k_m.gguf')) if os.path.exists(p)]
    kiln = os.path.join(args.build, 'bench', 'load_bench')
    peer = build_peer()
    sides = {'kiln': lambda m: run([kiln, m, '1', 'mmap'], [r'load .*median ([\d.]+) ms',
                                                            r'prepared .*median ([\d.]+) ms']),
             'llama.cpp': lambda m: run([peer, m, '1'], [r'load_ms ([\d.]+)'])}
    res = {}
    cold_left = {}
    for rep in range(args.repeats):
        for m in models:
            for cache in ('warm', 'cold'):
                order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
                for name in order:
                    if cache == 'warm':
                        make_warm(m)
                    else:
                        make_cold(m)
                        left = resident_bytes(m)
                        if left is not None:
                            cold_left[m] = max(cold_left.get(m, 0), left)
                    ms, rss = sides[name](m)
                    r = res.setdefault((m, cache, name), {'ms': [], 'ready': [], 'rss': []})
                    r['ms'].append(ms[0])
                    r['ready'].append(ms[-1])
                    r['rss'].append(rss)
    print(f'{args.repeats} loads per row, one per process, kiln and llama.cpp alternating; '
          f'median (min-max)')
    print(f'{"model":<34} {"cache":<5} {"kiln ms":>22} {"llama.cpp ms":>22} {"llama/kiln":>10} '
          f'{"kiln ready ms":>22} {"kiln peak RSS":>14} {"llama RSS":>10} {"file":>8}')
    for m in models:
        size = os.path.getsize(m) / (1 << 20)
        for cache in ('warm', 'cold'):
            k, ll = res[(m, cache, 'kiln')], res[(m, cache, 'llama.cpp')]
            ratio = statistics.median(ll['ms']) / statistics.median(k['ms'])
            print(f'{os.path.basename(m):<34} {cache:<5} {fmt(k["ms"]):>22} {fmt(ll["ms"]):>22} '
                  f'{ratio:>9.2f}x {fmt(k["ready"]):>22} {statistics.median(k["rss"]):>10.0f} MiB '
                  f'{statistics.median(ll["rss"]):>6.0f} MiB {size:>4.0f} MiB')
    for m, left in cold_left.items():
        print(f'cold: at most {left / (1 << 20):.1f} MiB of {os.path.basename(m)} still in the '
              f'page cache before a cold load (fincore)')


if __name__ == '__main__':
    main()
