#!/usr/bin/env python3
"""Load test: N concurrent streaming chat clients against kiln-server and llama.cpp's llama-server.

Each server is started on a free loopback port with the same model, compute threads and number of
parallel slots (-np N, each slot --ctx tokens), warmed with one request, then N clients start at
once (a barrier), each streaming one chat completion of --max-tokens tokens (ignore_eos, so every
response has the same length) from its own prompt behind a shared system prompt. A response counts
as failed unless it has HTTP 200, a finish_reason, exactly --max-tokens tokens of usage (or of
content chunks where the server sends no usage) and the closing [DONE]. Reported per server:
failures, wall time, generated tokens/s over the run, time to first token and end-to-end latency
(p50 / p99 over the clients).

Usage: python3 bench/server_load.py [--clients 64] [--max-tokens 32] [--threads 2]
           [--kiln-server build/samples/server/kiln-server] [--llama-server PATH] [--model M]
           [--only kiln|llama] [--llama-poll 0] [--repeats 3]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_KILN = os.path.join(HERE, '..', 'build', 'samples', 'server', 'kiln-server')
DEFAULT_LLAMA = os.path.expanduser('~/.cache/kiln/llama.cpp-0.3.36/build/bin/llama-server')
DEFAULT_MODEL = os.path.expanduser('~/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf')
SYSTEM = 'You are a helpful assistant. Answer briefly and clearly.'


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def get(port, path):
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=5)
    try:
        conn.request('GET', path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def wait_ready(port, proc, seconds=120):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f'server exited with {proc.returncode}')
        try:
            if get(port, '/health')[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError('server not ready')


def stream_chat(port, prompt, max_tokens, result):
    """One streaming request; fills result with ok, ttft, latency, tokens, error."""
    body = json.dumps({'model': 'bench', 'stream': True, 'max_tokens': max_tokens,
                       'temperature': 0, 'ignore_eos': True,
                       'stream_options': {'include_usage': True},
                       'messages': [{'role': 'system', 'content': SYSTEM},
                                    {'role': 'user', 'content': prompt}]})
    t0 = time.perf_counter()
    result.update(ok=False, ttft=None, latency=None, tokens=0, error='')
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=600)
    try:
        conn.request('POST', '/v1/chat/completions', body,
                     {'Content-Type': 'application/json'})
        r = conn.getresponse()
        if r.status != 200:
            result['error'] = f'HTTP {r.status}: {r.read()[:200]!r}'
            return
        chunks, usage, finish, done = 0, None, None, False
        for raw in r:
            line = raw.decode('utf-8', 'replace').strip()
            if not line.startswith('data:'):
                continue
            data = line[5:].strip()
            if data == '[DONE]':
                done = True
                break
            ev = json.loads(data)
            if 'error' in ev:
                result['error'] = str(ev['error'])[:200]
                return
            if ev.get('usage'):
                usage = ev['usage'].get('completion_tokens')
            for c in ev.get('choices', []):
                if (c.get('delta') or {}).get('content'):
                    chunks += 1
                    if result['ttft'] is None:
                        result['ttft'] = time.perf_counter() - t0
                finish = c.get('finish_reason') or finish
        result['latency'] = time.perf_counter() - t0
        result['tokens'] = usage if usage is not None else chunks
        if not done or finish is None:
            result['error'] = f'truncated (done {done}, finish {finish})'
        elif result['tokens'] != max_tokens:
            result['error'] = f'{result["tokens"]} tokens, expected {max_tokens}'
        else:
            result['ok'] = True
    except (OSError, ValueError, http.client.HTTPException) as e:
        result['error'] = f'{type(e).__name__}: {e}'
    finally:
        conn.close()


def run_load(port, clients, max_tokens):
    results = [dict() for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(i):
        barrier.wait()
        stream_chat(port, f'Client {i}: tell me one fact about the number {i}.', max_tokens,
                    results[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


def pct(values, p):
    if not values:
        return float('nan')
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def bench_server(name, cmd, port, args):
    log = open(os.devnull, 'w')
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        wait_ready(port, proc)
        stream_chat(port, 'Warm up.', 4, {})
        wall, results = run_load(port, args.clients, args.max_tokens)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    ok = [r for r in results if r.get('ok')]
    failures = [r['error'] for r in results if not r.get('ok')]
    tokens = sum(r['tokens'] for r in results if r.get('tokens'))
    return {'name': name, 'failed': len(failures), 'errors': failures[:3], 'wall': wall,
            'tok_s': tokens / wall,
            'ttft50': pct([r['ttft'] for r in ok], 50), 'ttft99': pct([r['ttft'] for r in ok], 99),
            'lat50': pct([r['latency'] for r in ok], 50),
            'lat99': pct([r['latency'] for r in ok], 99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--clients', type=int, default=64)
    ap.add_argument('--max-tokens', type=int, default=32)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--ctx', type=int, default=512, help='tokens per slot')
    ap.add_argument('--kiln-server', default=DEFAULT_KILN)
    ap.add_argument('--llama-server', default=DEFAULT_LLAMA)
    ap.add_argument('--model', default=DEFAULT_MODEL)
    ap.add_argument('--only', choices=['kiln', 'llama'])
    # llama.cpp's threads busy-wait for work (--poll 50 by default); on a shared, oversubscribed
    # machine that makes every step wait for descheduled spinners, so the default here is 0
    # (sleep), which is what kiln's thread pool does.
    ap.add_argument('--llama-poll', type=int, default=0)
    ap.add_argument('--repeats', type=int, default=1,
                    help='runs per server, alternating which goes first')
    args = ap.parse_args()
    n = args.clients
    commands = {}
    if args.only in (None, 'kiln'):
        commands['kiln-server'] = lambda port: [
            args.kiln_server, '-m', args.model, '--alias', 'bench', '--port', str(port),
            '-t', str(args.threads), '-np', str(n), '-c', str(args.ctx)]
    if args.only in (None, 'llama'):
        # llama-server's -c is the whole context, split evenly between its -np slots.
        commands['llama-server'] = lambda port: [
            args.llama_server, '-m', args.model, '--port', str(port), '--host', '127.0.0.1',
            '-t', str(args.threads), '-tb', str(args.threads), '-np', str(n),
            '-c', str(n * args.ctx), '--poll', str(args.llama_poll)]
    runs = {name: [] for name in commands}
    for rep in range(args.repeats):
        order = list(commands) if rep % 2 == 0 else list(reversed(commands))
        for name in order:
            port = free_port()
            runs[name].append(bench_server(name, commands[name](port), port, args))
    print(f'{n} concurrent streaming chat clients, {args.max_tokens} tokens each (ignore_eos, '
          f'greedy), {args.threads} threads, -np {n}, {args.ctx} tokens per slot, llama-server '
          f'--poll {args.llama_poll}; {args.repeats} runs each (median, min-max); load average '
          f'{os.getloadavg()[0]:.1f} at the end')
    keys = [('failed', 'failed', '{:.0f}'), ('wall', 'wall s', '{:.2f}'),
            ('tok_s', 'tok/s', '{:.1f}'), ('ttft50', 'TTFT p50', '{:.2f}'),
            ('ttft99', 'TTFT p99', '{:.2f}'), ('lat50', 'lat p50', '{:.2f}'),
            ('lat99', 'lat p99', '{:.2f}')]

    def cell(values, fmt):
        if len(values) == 1:
            return fmt.format(values[0])
        return (fmt.format(statistics.median(values)) + ' (' + fmt.format(min(values)) + '-' +
                fmt.format(max(values)) + ')')

    print(f'{"server":<13} ' + ' '.join(f'{title:>18}' for _, title, _ in keys))
    for name, rs in runs.items():
        print(f'{name:<13} ' + ' '.join(f'{cell([r[k] for r in rs], fmt):>18}'
                                        for k, _, fmt in keys))
        for r in rs:
            for e in r['errors']:
                print(f'  {name} failure: {e}')
    if len(runs) == 2:
        kiln, llama = runs['kiln-server'], runs['llama-server']
        ratios = [a['tok_s'] / b['tok_s'] for a, b in zip(kiln, llama)]
        print(f'throughput kiln/llama.cpp: {cell(ratios, "{:.2f}")} (per run, paired in order)')
    return 1 if any(r['failed'] for rs in runs.values() for r in rs) else 0


if __name__ == '__main__':
    sys.exit(main())
