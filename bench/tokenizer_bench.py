#!/usr/bin/env python3
"""Tokenizer throughput, kiln vs llama.cpp (llama-cpp-python), on the same GGUF and text.

Builds the benchmark text with `tokenizer_bench --write-text` (licenses + kiln sources repeated to
~5 MiB), runs kiln's tokenizer_bench on it (N repetitions in one process, model load excluded)
and llama-cpp-python's tokenizer (vocab_only, N repetitions of Llama.tokenize, load excluded),
then prints medians with min-max, the ratio kiln/llama.cpp, and checks that the token counts
agree and that the ids are identical.

Usage: python3 bench/tokenizer_bench.py [--build build] [--model PATH] [--reps 5] [--mb 5]
"""
import argparse
import array
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def fmt(xs):
    return f'{statistics.median(xs):8.2f}  ({min(xs):.2f} - {max(xs):.2f})'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', default=os.path.join(os.path.dirname(__file__), '..', 'build'))
    ap.add_argument('--model', default=os.path.expanduser(
        os.environ.get('KILN_MODEL_DIR', '~/.cache/kiln') + '/SmolLM2-135M-Instruct.Q4_1.gguf'))
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--mb', type=float, default=5)
    args = ap.parse_args()
    exe = os.path.join(args.build, 'bench', 'tokenizer_bench')
    if not os.path.exists(exe):
        sys.exit(f'{exe} not found: build the tokenizer_bench target first')

    with tempfile.TemporaryDirectory() as tmp:
        text_path = os.path.join(tmp, 'text.txt')
        subprocess.run([exe, '--write-text', text_path, '--mb', str(args.mb)], check=True,
                       stdout=subprocess.DEVNULL)
        data = open(text_path, 'rb').read()
        mb = len(data) / 1e6

        ids_path = os.path.join(tmp, 'ids.bin')
        out = subprocess.run([exe, '--model', args.model, '--text', text_path, '--reps',
                              str(args.reps), '--dump-ids', ids_path],
                             check=True, capture_output=True, text=True).stdout
        kiln_ids = array.array('i')
        kiln_ids.frombytes(open(ids_path, 'rb').read())
        kiln_s, kiln_tokens = [], set()
        for m in re.finditer(r'tokens (\d+) seconds ([0-9.]+)', out):
            kiln_tokens.add(int(m.group(1)))
            kiln_s.append(float(m.group(2)))

        import llama_cpp
        llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
        lc_s, lc_tokens = [], set()
        for _ in range(args.reps):
            t0 = time.perf_counter()
            ids = llm.tokenize(data, add_bos=False, special=False)
            lc_s.append(time.perf_counter() - t0)
            lc_tokens.add(len(ids))

    kiln_mbs = [mb / s for s in kiln_s]
    lc_mbs = [mb / s for s in lc_s]
    kiln_n = next(iter(kiln_tokens))
    lc_n = next(iter(lc_tokens))
    print(f'text: {len(data)} bytes (licenses + kiln sources), model '
          f'{os.path.basename(args.model)}, {args.reps} reps each, load time excluded')
    print(f'{"":10s} {"MB/s median (min - max)":>28s} {"Mtokens/s median":>17s}')
    for name, mbs, n, secs in (('kiln', kiln_mbs, kiln_n, kiln_s), ('llama.cpp', lc_mbs, lc_n, lc_s)):
        print(f'{name:10s} {fmt(mbs):>28s} {statistics.median([n / s / 1e6 for s in secs]):17.2f}')
    ratio = statistics.median(lc_s) / statistics.median(kiln_s)
    print(f'ratio kiln/llama.cpp (median throughput): {ratio:.2f}x')
    print(f'token counts: kiln {sorted(kiln_tokens)}  llama.cpp {sorted(lc_tokens)}')
    if kiln_tokens != lc_tokens or len(kiln_tokens) != 1:
        sys.exit('FAIL: token counts differ')
    if list(kiln_ids) != list(ids):
        first = next(i for i, (a, b) in enumerate(zip(kiln_ids, ids)) if a != b)
        sys.exit(f'FAIL: ids differ first at index {first}')
    print('token counts equal, ids identical: OK')


if __name__ == '__main__':
    main()
