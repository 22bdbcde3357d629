#!/usr/bin/env python3
"""deepseek2 (MLA + MoE), kiln vs llama.cpp's own llama-bench, on a model kiln-mkmodel writes.

The model: `kiln-mkmodel --shape deepseek2-bench --type q8_0` (DeepSeek-V2-Lite's attention at
width 1024: kv_lora_rank 512, 16 heads of 128 + 64, values 128, no q-LoRA; 8 layers, the first
dense, then 16 experts top-4 + 2 shared; ~351 MiB), written into ~/.cache/kiln/bench/ once.

Speed: bench_llama_bench.py's machinery (engine_bench --json next to llama-bench, alternating
which goes first): prefill512 and decode at depths 128 and 1,024, median (min-max) tok/s per
thread count.

Cache: kiln's MLA latent bytes per token (engine_bench's kv_bytes_per_position, f16) against
the K/V a GQA model of the same width (n_embd 1024, 8 layers, 16 heads of 64) keeps, 2·L·H_kv·64·2
bytes with 4 or 16 (MHA) KV heads, and against the decompressed K/V the latent stands for
(L·H·(192 + 128)·2).

Greedy: llama.cpp's llama-server (greedy, temperature 0, flash attention off: the arithmetic kiln's
llama.cpp order follows, and llama-bench's default; the server's default `auto` turns it on) and
kiln in the llama.cpp order (Python binding, greedy) continue the same raw prompts; the token ids
must be equal.

Usage: python3 bench/bench_deepseek2.py [--build build] [--type q8_0] [--threads 1,2] [--repeats 3]
           [--decode 16] [--skip-speed] [--skip-greedy] [--mla-prefill measured|absorbed]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import bench_llama_bench as lb

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_BIN = os.path.expanduser('~/.cache/kiln/llama.cpp-0.3.36/build/bin')
PROMPTS = ['The quick brown fox', 'Once upon a time, there was', 'In the beginning',
           'def main():\n    ', 'The capital of France is']


def ensure_model(build, weight_type):
    path = os.path.expanduser(f'~/.cache/kiln/bench/deepseek2-bench-{weight_type}.gguf')
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([os.path.join(build, 'tools', 'kiln-mkmodel', 'kiln-mkmodel'), '--shape',
                        'deepseek2-bench', '--type', weight_type, '--out', path], check=True)
    return path


def speed(args, engine, model):
    def run_kiln(exe, model, t, n_decode):
        return lb.run_kiln(exe, model, t, n_decode, ['--mla-prefill', args.mla_prefill])

    threads = [int(t) for t in args.threads.split(',')]
    res = {t: {'kiln': [], 'llama': []} for t in threads}
    for rep in range(args.repeats):
        for t in threads:
            sides = [('kiln', run_kiln, engine), ('llama', lb.run_llama, args.llama_bench)]
            for name, fn, exe in (sides if rep % 2 == 0 else sides[::-1]):
                res[t][name].append(fn(exe, model, t, args.decode))
                print(f'# repeat {rep}, {t} thread(s), {name}: {json.dumps(res[t][name][-1])}',
                      flush=True)
    print(f'{args.repeats} repeats, kiln and llama-bench alternating; decode {args.decode} '
          f'steps; kiln --mla-prefill {args.mla_prefill}; LOADED machine')
    hdr = (f'{"thr":>3} {"metric":<11} {"kiln tok/s":>22} {"llama-bench tok/s":>22} '
           f'{"kiln/llama":>17}')
    print(hdr)
    print('-' * len(hdr))
    for t in threads:
        k, l = res[t]['kiln'], res[t]['llama']
        for metric in lb.METRICS:
            kv = [x[metric + '_tps'] for x in k]
            lv = [x[metric + '_tps'] for x in l]
            ratio = [a / b for a, b in zip(kv, lv)]
            print(f'{t:>3} {metric:<11} {lb.fmt(kv):>22} {lb.fmt(lv):>22} {lb.fmt(ratio, 2):>17}')
    return res[threads[0]]['kiln'][0]['kv_bytes_per_position']


def cache_bytes(mla_bytes):
    layers, width, head_dim = 8, 1024, 64
    print(f'K/V cache bytes per token (f16), {layers} layers, width {width}:')
    print(f'  MLA latent (kiln, 512 + 64 per layer):           {mla_bytes:>7}')
    for n_kv in (4, 16):
        gqa = 2 * layers * n_kv * head_dim * 2
        print(f'  GQA, {n_kv:>2} KV heads x {head_dim}{" (MHA)" if n_kv == 16 else "      "}:'
              f'                {gqa:>7}  (MLA {mla_bytes / gqa:.2f}x)')
    dec = layers * 16 * (192 + 128) * 2
    print(f'  decompressed K/V (16 heads x (192 + 128)):        {dec:>7}  (MLA {mla_bytes / dec:.2f}x)')


def greedy(args, model, n_predict=24):
    port = 18473
    server = subprocess.Popen([os.path.join(LLAMA_BIN, 'llama-server'), '-m', model, '-t', '1',
                               '-c', '512', '--port', str(port), '-np', '1', '-fa', 'off'],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f'http://127.0.0.1:{port}/health') as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        sys.path.insert(0, os.path.join(HERE, '..', 'bindings', 'python'))
        os.environ.setdefault('KILN_LIBRARY', os.path.join(args.build, 'lib', 'c_api', 'libkiln.so'))
        import kiln  # pylint: disable=import-outside-toplevel
        kmodel = kiln.Model(model)
        cache = kiln.Cache(kmodel, n_threads=1, llama_cpp_order=True, prefix_caching=False)

        def post(path, body):
            req = urllib.request.Request(f'http://127.0.0.1:{port}{path}',
                                         data=json.dumps(body).encode(),
                                         headers={'Content-Type': 'application/json'})
            with urllib.request.urlopen(req) as r:
                return json.loads(r.read())

        same = 0
        for p in PROMPTS:
            ids = post('/tokenize', {'content': p})['tokens']
            got = post('/completion', {'prompt': ids, 'n_predict': n_predict, 'temperature': 0,
                                       'top_k': 1, 'n_probs': 2, 'cache_prompt': False,
                                       'return_tokens': True})
            llama = got['tokens']
            # llama-server reports candidates only where the text so far is whole UTF-8 (byte
            # tokens are merged into the next entry): line them up with the tokens by id.
            probs, j = [None] * len(llama), 0
            for i, t in enumerate(llama):
                entries = got['completion_probabilities']
                if j < len(entries) and entries[j]['id'] == t:
                    probs[i] = entries[j]['top_logprobs']
                    j += 1
            with cache.session() as s:  # greedy
                s.append_tokens(ids)
                mine = list(s.generate(max_tokens=n_predict).tokens)
            if mine == llama:
                same += 1
                print(f'  same:      {p!r} ({len(llama)} tokens)')
                continue
            # The first differing step, and how far apart llama.cpp's own top two candidates were.
            k = next((i for i in range(min(len(mine), len(llama))) if mine[i] != llama[i]),
                     min(len(mine), len(llama)))
            top = probs[k] if k < len(probs) and probs[k] else []
            gap = top[0]['logprob'] - top[1]['logprob'] if len(top) > 1 else float('nan')
            print(f'  DIFFERENT: {p!r} from step {k} of {len(llama)}; llama.cpp\'s top two '
                  f'log-probs there {gap:.4f} apart\n    llama.cpp {llama}\n    kiln      {mine}')
        print(f'greedy (llama.cpp order, {n_predict} tokens): {same}/{len(PROMPTS)} prompts '
              'identical')
    finally:
        server.terminate()
        server.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--type', default='q8_0', help='weight type kiln-mkmodel writes')
    ap.add_argument('--llama-bench', default=os.path.join(LLAMA_BIN, 'llama-bench'))
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--decode', type=int, default=16)
    ap.add_argument('--skip-speed', action='store_true')
    ap.add_argument('--skip-greedy', action='store_true')
    ap.add_argument('--mla-prefill', default='measured', choices=['measured', 'absorbed'],
                    help="kiln's MLA prefill form (engine_bench --mla-prefill, "
                         "kiln_cache_params.mla_prefill; the library's default is absorbed, which "
                         "keeps the bitwise chunking guarantees)")
    args = ap.parse_args()
    model = ensure_model(args.build, args.type)
    engine = os.path.join(args.build, 'bench', 'engine_bench')
    if not args.skip_greedy:
        greedy(args, model)
    if not args.skip_speed:
        mla_bytes = speed(args, engine, model)
    else:
        mla_bytes = lb.run_kiln(engine, model, 1, 1)['kv_bytes_per_position']
    cache_bytes(mla_bytes)


if __name__ == '__main__':
    main()
