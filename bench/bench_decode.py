#!/usr/bin/env python3
"""Engine speed, kiln vs llama.cpp (llama-cpp-python), in one run on the same GGUFs and tokens.

For each model file x thread count, runs kiln's engine_bench (one process per repeat, `--json`)
and llama-cpp-python (Llama(model_path, n_threads=T, n_threads_batch=T, n_ctx=2048,
n_batch=512, logits_all=False), one instance per config kept across repeats), alternating which
side goes first from repeat to repeat. Both sides time the same phases on the same prompt tokens
(the first 1,024 tokens of docs/kv_cache.md, tokenized by llama.cpp, repeated if short):
  prefill512: a fresh context, 512 prompt tokens in one batch (tokens/s = 512 / time);
  decode1024: that context extended (untimed) to 1,024 tokens, then N greedy steps, one token
              per eval, argmax of the logits included (tokens/s = N / time);
  decode128:  a fresh context of 128 prompt tokens (untimed), then N greedy steps.
It also measures the machine's read bandwidth (engine_bench --bandwidth, 1 GiB, 1 and 2 threads,
once per repeat) and prints each decode figure as a fraction of the roofline
  bandwidth / (weight bytes read per token + KV bytes per position * (context + N/2)),
where the weight bytes are every tensor but a non-tied embedding table (f16 K/V on both sides).

The Q8_0 model is made by kiln's own quantizer (`kiln-quantize IN OUT --type q8_0`) from the
Q4_1 file unless --q8 names an existing file.

Usage: python3 bench/bench_decode.py [--build build] [--model Q4_1.gguf] [--q8 PATH]
                                     [--threads 1,2] [--repeats 5] [--decode 64]
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
METRICS = ('prefill512', 'decode128', 'decode1024')
CONTEXT = {'decode128': 128, 'decode1024': 1024}


def stats(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs, prec=1):
    m, lo, hi = stats(xs)
    return f'{m:.{prec}f} ({lo:.{prec}f}-{hi:.{prec}f})'


def run_kiln(exe, model, threads, tokens_path, n_decode):
    out = subprocess.run([exe, '--model', model, '--threads', str(threads), '--repeats', '1',
                          '--decode', str(n_decode), '--tokens', tokens_path, '--json'],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class LlamaSide:
    def __init__(self, model, threads):
        import llama_cpp
        self.llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads,
                                   n_ctx=2048, n_batch=512, logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def argmax(self):
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def decode(self, n):
        tok, gen = self.argmax(), []
        for _ in range(n):
            gen.append(tok)
            self.llm.eval([tok])
            tok = self.argmax()
        return gen

    def run(self, prompt, n_decode):
        llm, r = self.llm, {}
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt[:512])
        r['prefill512_tps'] = 512 / (time.perf_counter() - t0)
        llm.eval(prompt[512:1024])
        t0 = time.perf_counter()
        r['gen1024'] = self.decode(n_decode)
        r['decode1024_tps'] = n_decode / (time.perf_counter() - t0)
        llm.reset()
        llm.eval(prompt[:128])
        t0 = time.perf_counter()
        r['gen128'] = self.decode(n_decode)
        r['decode128_tps'] = n_decode / (time.perf_counter() - t0)
        return r


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def print_table(args, prompt, bw, configs, res, done, llama_version):
    print(f'prompt: {len(prompt)} tokens of docs/kv_cache.md; decode {args.decode} greedy steps; '
          f'{done} of {args.repeats} repeats, kiln and llama.cpp alternating; llama-cpp-python '
          f'{llama_version}')
    for t in sorted(bw):
        print(f'read bandwidth {t} thread(s): {fmt(bw[t], 2)} GB/s (median of each repeat\'s '
              f'3-pass median, min-max)')
    print()
    hdr = (f'{"model":<34} {"thr":>3} {"metric":<11} {"kiln tok/s":>22} {"llama.cpp tok/s":>22} '
           f'{"ratio":>19} {"kiln roof":>9} {"llama roof":>10}')
    print(hdr)
    print('-' * len(hdr))
    for (m, t) in configs:
        k, l = res[(m, t)]['kiln'], res[(m, t)]['llama']
        wbytes = k[0]['weight_bytes_per_token']
        kvpos = k[0]['kv_bytes_per_position']
        for metric in METRICS:
            kv = [x[metric + '_tps'] for x in k]
            lv = [x[metric + '_tps'] for x in l]
            ratio = [a / b for a, b in zip(kv, lv)]  # per repeat (adjacent runs)
            roof_k = roof_l = ''
            if metric in CONTEXT:
                ctx = CONTEXT[metric] + args.decode / 2
                roofline = statistics.median(bw[t]) * 1e9 / (wbytes + kvpos * ctx)
                roof_k = f'{statistics.median(kv) / roofline:.0%}'
                roof_l = f'{statistics.median(lv) / roofline:.0%}'
            print(f'{os.path.basename(m):<34} {t:>3} {metric:<11} {fmt(kv):>22} {fmt(lv):>22} '
                  f'{fmt(ratio, 2):>19} {roof_k:>9} {roof_l:>10}')
        rss = max(x['peak_rss_kib'] for x in k) / 1024
        pool = ((1024 + args.decode + 15) // 16 + 2) * 16 * kvpos / 2**20
        fsize = os.path.getsize(m) / 2**20
        same128 = common_prefix(k[0]['gen128'], l[0]['gen128'])
        same1024 = common_prefix(k[0]['gen1024'], l[0]['gen1024'])
        print(f'    weights/token {wbytes / 1e6:.1f} MB, KV/position {kvpos / 1e3:.1f} KB; '
              f'kiln peak RSS {rss:.1f} MiB (file {fsize:.1f} + KV pool {pool:.1f} + 100 = '
              f'{fsize + pool + 100:.1f} MiB budget); greedy tokens equal to llama.cpp: '
              f'{same128}/{args.decode} @128, {same1024}/{args.decode} @1024')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--model', default=os.path.expanduser(
        os.environ.get('KILN_MODEL_DIR', '~/.cache/kiln') + '/SmolLM2-135M-Instruct.Q4_1.gguf'))
    ap.add_argument('--q8', default='', help='Q8_0 copy (default: made with kiln-quantize)')
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--repeats', type=int, default=5)
    ap.add_argument('--decode', type=int, default=64)
    ap.add_argument('--workdir', default='/tmp/kiln-bench')
    args = ap.parse_args()
    exe = os.path.join(args.build, 'bench', 'engine_bench')
    if not os.path.exists(exe):
        sys.exit(f'{exe} not found: build the engine_bench target first')
    os.makedirs(args.workdir, exist_ok=True)
    threads = [int(t) for t in args.threads.split(',')]

    q8 = args.q8
    if not q8:
        q8 = os.path.join(args.workdir, os.path.basename(args.model).replace('Q4_1', 'Q8_0'))
        if q8 == os.path.join(args.workdir, os.path.basename(args.model)):
            q8 += '.q8_0.gguf'
        quant = os.path.join(args.build, 'tools', 'kiln-quantize', 'kiln-quantize')
        if not os.path.exists(quant):
            sys.exit(f'{quant} not found: build kiln-quantize or pass --q8 PATH')
        subprocess.run([quant, args.model, q8, '--type', 'q8_0'], check=True,
                       stdout=subprocess.DEVNULL)
    models = [args.model, q8]

    # Memory bandwidth: measured again in every repeat (3 passes each), so that the roofline
    # sees the same machine load as the decode runs; bw[t] = all passes' GB/s.
    bw = {t: [] for t in sorted(set(threads) | {1, 2})}

    def measure_bandwidth():
        for t in bw:
            out = subprocess.run([exe, '--bandwidth', '--threads', str(t), '--repeats', '3',
                                  '--json'], check=True, capture_output=True, text=True).stdout
            bw[t].append(json.loads(out)['bandwidth_gbs'])
    # Prompt tokens, tokenized once by llama.cpp and given to both sides.
    import llama_cpp
    vocab = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    text = open(os.path.join(HERE, '..', 'docs', 'kv_cache.md'), 'rb').read()
    prompt = vocab.tokenize(text, add_bos=False, special=False)
    while len(prompt) < 1024:
        prompt = prompt + prompt
    prompt = prompt[:1024]
    del vocab
    tokens_path = os.path.join(args.workdir, 'prompt_tokens.txt')
    with open(tokens_path, 'w') as f:
        f.write(' '.join(map(str, prompt)) + '\n')

    configs = [(m, t) for m in models for t in threads]
    llama = {c: LlamaSide(*c) for c in configs}
    res = {c: {'kiln': [], 'llama': []} for c in configs}
    t_start = time.time()
    for r in range(args.repeats):
        measure_bandwidth()
        for c in configs:
            order = ('kiln', 'llama') if r % 2 == 0 else ('llama', 'kiln')
            for side in order:
                if side == 'kiln':
                    res[c]['kiln'].append(run_kiln(exe, c[0], c[1], tokens_path, args.decode))
                else:
                    res[c]['llama'].append(llama[c].run(prompt, args.decode))
        print(f'repeat {r + 1}/{args.repeats} done ({time.time() - t_start:.0f} s)',
              file=sys.stderr, flush=True)

        print()
        print_table(args, prompt, bw, configs, res, r + 1, llama_cpp.__version__)
        sys.stdout.flush()


if __name__ == '__main__':
    main()
