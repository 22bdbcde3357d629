#!/usr/bin/env python3
"""Many sessions on one cache, kiln vs llama.cpp, in one run on the same GGUF, threads and lengths.

For N concurrent sequences (default 1, 2, 4, 8, 16, 32), each with its own P-token prompt
(default 32) decoding G tokens (default 64) greedily, prints the aggregate decode tokens/s of
  kiln:      bench/batch_bench (Session::Submit + Scheduler::Step: continuous batching), and
  llama.cpp: its own C++ llama-batched-bench (built by bench/build_llama_cpp.sh), N parallel
             sequences in one llama_batch per step, not sharing the prompt (speed_tg =
             N * G / generation time),
with the median and min-max over R repeats (default 3), each repeat running both sides
back to back and alternating which goes first, the ratio kiln / llama.cpp (median and
min-max of the per-repeat ratios) and each side's scaling against its own N = 1.

Usage: python3 bench/bench_batch.py [--build build] [--model PATH] [--threads 2]
                                    [--sessions 1,2,4,8,16,32] [--prompt 32] [--decode 64]
                                    [--repeats 3] [--llama-bin DIR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fmt(xs, prec=1):
    return (f'{statistics.median(xs):.{prec}f} '
            f'({min(xs):.{prec}f}-{max(xs):.{prec}f})')


def run_kiln(exe, args, sessions):
    """Aggregate decode tok/s per N from batch_bench's table ("N  median  min-max ...")."""
    out = subprocess.run([exe, '--model', args.model, '--threads', str(args.threads),
                          '--repeats', '1', '--prompt', str(args.prompt),
                          '--decode', str(args.decode),
                          '--sessions', ','.join(map(str, sessions))],
                         check=True, capture_output=True, text=True).stdout
    rates = {}
    for line in out.splitlines():
        m = re.match(r'^(\d+)\s+([\d.]+)\s', line)
        if m:
            rates[int(m.group(1))] = float(m.group(2))
    missing = [n for n in sessions if n not in rates]
    if missing:
        sys.exit(f'batch_bench printed no rate for N = {missing}:\n{out}')
    return rates


def run_llama(exe, args, sessions):
    ctx = max(sessions) * (args.prompt + args.decode) + 256
    out = subprocess.run([exe, '-m', args.model, '-c', str(ctx), '-b', '2048', '-ub', '512',
                          '-npp', str(args.prompt), '-ntg', str(args.decode),
                          '-npl', ','.join(map(str, sessions)), '-t', str(args.threads),
                          '-tb', str(args.threads), '--output-format', 'jsonl'],
                         check=True, capture_output=True, text=True).stdout
    rates = {}
    for line in out.splitlines():
        if line.startswith('{'):
            row = json.loads(line)
            rates[int(row['pl'])] = float(row['speed_tg'])
    missing = [n for n in sessions if n not in rates]
    if missing:
        sys.exit(f'llama-batched-bench printed no rate for N = {missing}')
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--model', default=os.path.expanduser(
        '~/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf'))
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--sessions', default='1,2,4,8,16,32')
    ap.add_argument('--prompt', type=int, default=32)
    ap.add_argument('--decode', type=int, default=64)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--llama-bin', default='',
                    help='directory of llama-batched-bench (default: bench/build_llama_cpp.sh)')
    args = ap.parse_args()
    sessions = [int(n) for n in args.sessions.split(',')]

    kiln_exe = os.path.join(args.build, 'bench', 'batch_bench')
    if not os.path.exists(kiln_exe):
        sys.exit(f'{kiln_exe} not found: cmake --build {args.build} --target batch_bench')
    llama_bin = args.llama_bin or subprocess.run(
        [os.path.join(HERE, 'build_llama_cpp.sh')], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1]
    llama_exe = os.path.join(llama_bin, 'llama-batched-bench')

    kiln = {n: [] for n in sessions}
    llama = {n: [] for n in sessions}
    for r in range(args.repeats):
        sides = [('kiln', run_kiln, kiln_exe, kiln), ('llama', run_llama, llama_exe, llama)]
        if r % 2:
            sides.reverse()
        for _, run, exe, into in sides:
            for n, rate in run(exe, args, sessions).items():
                into[n].append(rate)
        print(f'repeat {r + 1}/{args.repeats} done', file=sys.stderr)

    print(f'{os.path.basename(args.model)}, {args.threads} threads, prompt {args.prompt}, '
          f'decode {args.decode} greedy, {args.repeats} repeats alternating; aggregate decode '
          f'tok/s, median (min-max)')
    print(f'{"N":>3} {"kiln":>24} {"llama.cpp":>24} {"ratio":>20} {"kiln xN=1":>10} '
          f'{"llama xN=1":>11}')
    for n in sessions:
        ratios = [k / l for k, l in zip(kiln[n], llama[n])]
        print(f'{n:>3} {fmt(kiln[n]):>24} {fmt(llama[n]):>24} {fmt(ratios, 2):>20} '
              f'{statistics.median(kiln[n]) / statistics.median(kiln[sessions[0]]):>10.2f} '
              f'{statistics.median(llama[n]) / statistics.median(llama[sessions[0]]):>11.2f}')


if __name__ == '__main__':
    main()
