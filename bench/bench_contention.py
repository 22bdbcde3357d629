#!/usr/bin/env python3
"""Decode speed with and without busy threads competing for the cores.

A host application rarely leaves kiln the machine to itself. This driver measures what a
competing busy thread costs: for each thread count and number of competitors it runs
  kiln generate -m MODEL --temp 0 -n N --threads T -p PROMPT --quiet
R times and prints the generated tokens/s as median (min-max). A competitor is a separate
process spinning in a busy loop, pinned nowhere, started before the run and stopped after it.

Several --kiln programs (for example a copy of an older build, with its libkiln.so beside it)
are run side by side, their order rotating from repeat to repeat so drift in machine load hits
each of them alike.

Usage: python3 bench/bench_contention.py [--kiln build/tools/kiln/kiln ...] [--model M]
           [--threads 1,2] [--competitors 0,1] [--repeats 5] [-n 64] [--prompt TEXT]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_KILN = os.path.join(HERE, '..', 'build', 'tools', 'kiln', 'kiln')
DEFAULT_MODEL = os.path.expanduser('~/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf')
SPEED = re.compile(r'generated: (\d+) tokens, ([0-9.]+) tok/s')


def run_generate(kiln, model, threads, n, prompt):
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(kiln))
    if os.path.exists(os.path.join(here, 'libkiln.so.0')):  # a copied build: its own library
        env['LD_LIBRARY_PATH'] = here + os.pathsep + env.get('LD_LIBRARY_PATH', '')
    out = subprocess.run([kiln, 'generate', '-m', model, '--temp', '0', '-n', str(n),
                          '--threads', str(threads), '-p', prompt, '--quiet'],
                         capture_output=True, text=True, env=env, check=True)
    m = SPEED.search(out.stdout + out.stderr)
    if not m:
        sys.exit(f'no "generated: ... tok/s" line from {kiln}:\n{out.stdout}\n{out.stderr}')
    return float(m.group(2))


def start_competitors(count):
    procs = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(count)]
    if procs:
        time.sleep(0.3)  # let them reach the busy loop
    return procs


def stop_competitors(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--kiln', action='append', help='kiln program (repeatable)')
    ap.add_argument('--model', default=DEFAULT_MODEL)
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--competitors', default='0,1')
    ap.add_argument('--repeats', type=int, default=5)
    ap.add_argument('-n', type=int, default=64)
    ap.add_argument('--prompt', default='Tell me a story')
    args = ap.parse_args()
    kilns = args.kiln or [DEFAULT_KILN]
    threads = [int(t) for t in args.threads.split(',')]
    competitors = [int(c) for c in args.competitors.split(',')]

    speeds = {}  # (kiln, threads, competitors) -> [tok/s]
    for r in range(args.repeats):
        order = kilns[r % len(kilns):] + kilns[:r % len(kilns)]
        for t in threads:
            for c in competitors:
                procs = start_competitors(c)
                try:
                    for k in order:
                        speeds.setdefault((k, t, c), []).append(
                            run_generate(k, args.model, t, args.n, args.prompt))
                finally:
                    stop_competitors(procs)
        print(f'repeat {r + 1}/{args.repeats} done', file=sys.stderr)

    print(f'kiln generate -n {args.n} --temp 0, {args.repeats} repeats, tokens/s median (min-max); '
          f'load average at the end {os.getloadavg()[0]:.1f}')
    print(f'{"program":<40} {"thr":>3} {"busy":>4} {"tok/s":>24}')
    for k in kilns:
        for t in threads:
            for c in competitors:
                xs = speeds[(k, t, c)]
                print(f'{k[-40:]:<40} {t:>3} {c:>4} '
                      f'{statistics.median(xs):>8.1f} ({min(xs):.1f}-{max(xs):.1f})')


if __name__ == '__main__':
    main()
