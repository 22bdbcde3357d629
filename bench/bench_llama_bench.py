#!/usr/bin/env python3
"""Engine speed, kiln vs llama.cpp's own C++ llama-bench, interleaved, on the same GGUFs.

bench_decode.py drives llama.cpp through llama-cpp-python's Python loop, which understates it;
this script runs llama.cpp's `llama-bench` (built by bench/build_llama_cpp.sh into a cache outside
the repo) next to kiln's engine_bench, alternating which side goes first from repeat to repeat:
  prefill512: kiln: 512 prompt tokens in one Forward; llama-bench: -p 512 (pp512)
  decode128 / decode1024 / decode4096: N greedy steps after a 128 / 1,024 / 4,096-token
              context; llama-bench: -n N -d 128 / -d 1024 / -d 4096 (tg at that depth)
It measures the read bandwidth (engine_bench --bandwidth, 1 GiB) per thread count once per
repeat and prints each decode figure as a share of the roofline
  bandwidth / (weight bytes per token + KV bytes per position * (context + N/2)),
with kiln's byte counts (engine_bench --json). --probe-each also measures it right before each
model's pair of runs at that run's thread count and divides each run by its own probe (the
shares' median over the repeats): on a machine whose bandwidth drifts within minutes (a VM's
two-thread read swung 47-80 GB/s within one run), a probe minutes away says little.

Usage: python3 bench/bench_llama_bench.py --model A.gguf [--model B.gguf ...] [--build build]
           [--llama-bench PATH] [--threads 1,2] [--repeats 3] [--decode 64] [--bandwidth 27.9,34.2]
           [--metrics prefill512,decode128,decode1024] [--kv-type f16|q8_0] [--probe-each]
--metrics: the rows to measure and print, of prefill512, decode128, decode1024 and decode4096
(llama-bench runs only what they need; kiln's engine_bench measures the first three in one run
either way, and decode4096 only when asked: its 4,096-token context costs a long prefill).
--kv-type: both engines' K/V cache element type (default f16; q8_0 runs llama-bench with
-ctk q8_0 -ctv q8_0, which its quantized V needs flash attention for: -fa on).
"""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
CONTEXT = {'decode128': 128, 'decode1024': 1024, 'decode4096': 4096}
METRICS = ('prefill512', 'decode128', 'decode1024', 'decode4096')
DEFAULT_METRICS = ('prefill512', 'decode128', 'decode1024')


def fmt(xs, prec=1):
    return f'{statistics.median(xs):.{prec}f} ({min(xs):.{prec}f}-{max(xs):.{prec}f})'


def roof_share(tps, gbs, bytes_per_token):
    """The median over the runs of tokens/s as a share of the roofline of each run's GB/s."""
    return statistics.median(v * bytes_per_token / (g * 1e9) for v, g in zip(tps, gbs))


def run_kiln(exe, model, threads, n_decode, extra_args=()):
    out = subprocess.run([exe, '--model', model, '--threads', str(threads), '--repeats', '1',
                          '--decode', str(n_decode), '--json', *extra_args],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_llama(exe, model, threads, n_decode, metrics=METRICS, extra_args=()):
    """tok/s of pp512 and of tg N at depths 128, 1,024 and 4,096 (one llama-bench repetition
    each), of those in `metrics`."""
    r = {}
    runs = [['-p', '512', '-n', '0']] if 'prefill512' in metrics else []
    depths = [str(CONTEXT[m]) for m in metrics if m in CONTEXT]
    if depths:
        runs.append(['-p', '0', '-n', str(n_decode), '-d', ','.join(depths)])
    for args in runs:
        out = subprocess.run([exe, '-m', model, '-t', str(threads), '-r', '1', '-o', 'json',
                              *extra_args] + args,
                             check=True, capture_output=True, text=True).stdout
        for test in json.loads(out):
            if test['n_prompt'] == 512:
                r['prefill512_tps'] = test['avg_ts']
            else:
                r[f'decode{test["n_depth"]}_tps'] = test['avg_ts']
    return r


def bandwidth(exe, threads):
    out = subprocess.run([exe, '--bandwidth', '--threads', str(threads), '--repeats', '3', '--json'],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])['bandwidth_gbs']


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', action='append', required=True)
    ap.add_argument('--build', default=os.path.join(HERE, '..', 'build'))
    ap.add_argument('--llama-bench', default=os.path.expanduser(
        '~/.cache/kiln/llama.cpp-0.3.36/build/bin/llama-bench'))
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--decode', type=int, default=64)
    ap.add_argument('--metrics', default=','.join(DEFAULT_METRICS))
    ap.add_argument('--kv-type', default='f16', choices=('f16', 'q8_0'))
    ap.add_argument('--probe-each', action='store_true',
                    help='probe the bandwidth before each pair of runs and divide by it')
    ap.add_argument('--bandwidth', default='',
                    help='GB/s per thread count, e.g. 27.9,34.2, instead of measuring it (a '
                         'loaded machine measures its load, not its memory)')
    args = ap.parse_args()
    metrics = args.metrics.split(',')
    unknown = set(metrics) - set(METRICS)
    if unknown:
        ap.error(f'--metrics: unknown {sorted(unknown)} (known: {", ".join(METRICS)})')
    engine = os.path.join(args.build, 'bench', 'engine_bench')
    threads = [int(t) for t in args.threads.split(',')]
    configs = [(m, t) for m in args.model for t in threads]
    res = {c: {'kiln': [], 'llama': []} for c in configs}
    bw = {t: [] for t in threads}
    probes = {c: [] for c in configs}  # --probe-each: the probe before each pair, per repeat
    for rep in range(args.repeats):
        for i, t in enumerate(threads):
            bw[t].append(float(args.bandwidth.split(',')[i]) if args.bandwidth else
                         bandwidth(engine, t))
        for c in configs:
            if args.probe_each:
                probes[c].append(bandwidth(engine, c[1]))
            kiln_args = ['--kv-type', args.kv_type]
            if 'decode4096' in metrics:
                kiln_args.append('--decode4096')
            llama_args = []
            if args.kv_type == 'q8_0':
                llama_args = ['-ctk', 'q8_0', '-ctv', 'q8_0', '-fa', 'on']
            sides = [('kiln', lambda: run_kiln(engine, c[0], c[1], args.decode, kiln_args)),
                     ('llama', lambda: run_llama(args.llama_bench, c[0], c[1], args.decode,
                                                 metrics, llama_args))]
            for name, fn in (sides if rep % 2 == 0 else sides[::-1]):
                res[c][name].append(fn())
    print(f'{args.repeats} repeats, kiln and llama-bench alternating; decode {args.decode} steps; '
          f'{args.kv_type} K/V')
    for t in threads:
        print(f'read bandwidth {t} thread(s): {fmt(bw[t], 2)} GB/s')
    hdr = (f'{"model":<30} {"thr":>3} {"metric":<11} {"kiln tok/s":>22} {"llama-bench tok/s":>22} '
           f'{"ratio":>17} {"kiln roof":>9} {"llama roof":>10}')
    print(hdr)
    print('-' * len(hdr))
    for (m, t) in configs:
        k, l = res[(m, t)]['kiln'], res[(m, t)]['llama']
        wbytes, kvpos = k[0]['weight_bytes_per_token'], k[0]['kv_bytes_per_position']
        for metric in metrics:
            kv = [x[metric + '_tps'] for x in k]
            lv = [x[metric + '_tps'] for x in l]
            ratio = [a / b for a, b in zip(kv, lv)]  # per repeat (adjacent runs)
            roof_k = roof_l = ''
            if metric in CONTEXT:
                ctx = CONTEXT[metric] + args.decode / 2
                bytes_per_token = wbytes + kvpos * ctx
                gbs = probes[(m, t)] if args.probe_each else [statistics.median(bw[t])] * len(kv)
                roof_k = f'{roof_share(kv, gbs, bytes_per_token):.0%}'
                roof_l = f'{roof_share(lv, gbs, bytes_per_token):.0%}'
            print(f'{os.path.basename(m):<30} {t:>3} {metric:<11} {fmt(kv):>22} {fmt(lv):>22} '
                  f'{fmt(ratio, 2):>17} {roof_k:>9} {roof_l:>10}')
        rss = max(x['peak_rss_kib'] for x in k) / 1024
        print(f'    weights/token {wbytes / 1e6:.1f} MB, KV/position {kvpos / 1e3:.1f} KB, '
              f'kiln peak RSS {rss:.1f} MiB, file {os.path.getsize(m) / 2**20:.1f} MiB' +
              (f', probes {fmt(probes[(m, t)], 2)} GB/s' if args.probe_each else ''))


if __name__ == '__main__':
    main()
