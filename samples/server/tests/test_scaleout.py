"""Two kiln-server replicas behind nginx on loopback: prefix-hash routing against round-robin.

Starts 2 replicas with the default model and one nginx (free ports, config generated in a temp
dir) with two front ports: one round-robin upstream, one `hash $kiln_route_key consistent`
upstream using samples/server/deploy/prefix_route.conf. Each mode sends the same workload shape
(CONVERSATIONS conversations, each with its own long system prompt, ROUNDS turns, one request per
conversation per round in a fixed order; every turn re-sends the history) with text unique to the
mode, so one mode's cached prefixes never help the other. The prefix-hit rate is the replicas'
summed /health `cache.prefix_hit_tokens` over `cache.prefix_query_tokens`, as deltas over the mode.

Exit 77 (ctest: skipped) when nginx is not installed. Environment: KILN_SERVER (the binary),
KILN_MODEL_DIR (default ~/.cache/kiln).
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROUTE_CONF = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "prefix_route.conf"
CONVERSATIONS = 3  # odd, so round-robin in a fixed order moves each conversation every round
ROUNDS = 2
MAX_TOKENS = 4


def find_nginx():
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replica(binary, model):
    proc = subprocess.Popen(
        [binary, "-m", model, "--alias", "smollm2", "--port", "0", "-t", "2", "-c", "1024",
         "-np", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on http://" not in line:
        raise RuntimeError(f"kiln-server did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split("listening on http://")[1].split(" ")[0].rstrip("/")


def nginx_config(tmp, replicas, rr_port, hash_port):
    servers = "".join(f"        server {r};\n" for r in replicas)
    return f"""
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    # $request_body (the routing key) exists only for a body held in memory.
    client_body_buffer_size 1m;
    client_max_body_size 1m;
    include {ROUTE_CONF};
    upstream kiln_round_robin {{
{servers}    }}
    upstream kiln_prefix_hash {{
        hash $kiln_route_key consistent;
{servers}    }}
    server {{
        listen 127.0.0.1:{rr_port};
        location / {{ proxy_pass http://kiln_round_robin; proxy_buffering off;
                     add_header X-Kiln-Replica $upstream_addr always; }}
    }}
    server {{
        listen 127.0.0.1:{hash_port};
        location / {{ proxy_pass http://kiln_prefix_hash; proxy_buffering off;
                     add_header X-Kiln-Replica $upstream_addr always; }}
    }}
}}
"""


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def chat(base, messages):
    """(reply text, completion tokens, replica address) of one greedy chat request."""
    body = json.dumps({"messages": messages, "model": "smollm2", "max_tokens": MAX_TOKENS,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        replica = r.headers.get("X-Kiln-Replica")
        out = json.loads(r.read())
    return (out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"], replica)


def system_prompt(mode, conv):
    # ~200 tokens, unique to (mode, conversation): a long shared prefix for that conversation.
    facts = " ".join(f"Fact {i}: the {mode} archive {conv} shelf {i} holds {i * 7 + conv} books."
                     for i in range(10))
    return f"You are librarian {conv} of the {mode} library. Answer briefly. {facts}"


def run_mode(mode, front, replica_bases):
    def totals():
        hit = query = 0
        for b in replica_bases:
            h = get_json(b + "/health")["cache"]
            hit += h["prefix_hit_tokens"]
            query += h["prefix_query_tokens"]
        return hit, query

    hit0, query0 = totals()
    histories = [[{"role": "system", "content": system_prompt(mode, c)}]
                 for c in range(CONVERSATIONS)]
    replicas_seen = [set() for _ in range(CONVERSATIONS)]
    tokens = 0
    start = time.monotonic()
    for rnd in range(ROUNDS):
        for c in range(CONVERSATIONS):
            histories[c].append({"role": "user", "content": f"Question {rnd}: how many books "
                                 f"are on shelf {rnd + c}?"})
            text, n, replica = chat(front, histories[c])
            histories[c].append({"role": "assistant", "content": text})
            tokens += n
            replicas_seen[c].add(replica)
    seconds = time.monotonic() - start
    hit1, query1 = totals()
    rate = (hit1 - hit0) / max(1, query1 - query0)
    print(f"{mode}: prefix hit rate {rate:.3f} ({hit1 - hit0}/{query1 - query0} prompt tokens), "
          f"{ROUNDS * CONVERSATIONS} requests in {seconds:.2f} s "
          f"({ROUNDS * CONVERSATIONS / seconds:.2f} req/s, {tokens / seconds:.1f} completion "
          f"tok/s), replicas per conversation {[len(s) for s in replicas_seen]}", flush=True)
    return rate, replicas_seen


def main():
    nginx = find_nginx()
    if nginx is None:
        print("server_scaleout_test: skipped: nginx is not installed "
              "(scripts/install_deps.sh installs Debian's nginx)")
        return 77
    binary = os.environ.get("KILN_SERVER")
    assert binary, "KILN_SERVER must name the kiln-server binary"
    model = pathlib.Path(os.environ.get("KILN_MODEL_DIR",
                                        str(pathlib.Path.home() / ".cache" / "kiln"))) / MODEL_FILE
    assert model.exists(), f"{model} is missing: run scripts/fetch_model.sh"

    t0 = time.monotonic()
    procs = []
    nginx_proc = None
    with tempfile.TemporaryDirectory(prefix="kiln-scaleout-") as tmp:
        try:
            replica_addrs = []
            for _ in range(2):
                proc, addr = start_replica(binary, str(model))
                procs.append(proc)
                replica_addrs.append(addr)
            rr_port, hash_port = free_port(), free_port()
            conf = pathlib.Path(tmp) / "nginx.conf"
            conf.write_text(nginx_config(tmp, replica_addrs, rr_port, hash_port))
            nginx_proc = subprocess.Popen(
                [nginx, "-p", tmp, "-c", str(conf), "-g", "daemon off;"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            bases = ["http://" + a for a in replica_addrs]
            for port in (rr_port, hash_port):  # wait until nginx answers on both ports
                deadline = time.monotonic() + 10
                while True:
                    try:
                        get_json(f"http://127.0.0.1:{port}/health")
                        break
                    except OSError:
                        if nginx_proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"nginx did not start: {nginx_proc.stdout.read()}"
                                               f"{(pathlib.Path(tmp) / 'error.log').read_text()}")
                        time.sleep(0.05)

            rr_rate, rr_seen = run_mode("round-robin", f"http://127.0.0.1:{rr_port}", bases)
            hash_rate, hash_seen = run_mode("prefix-hash", f"http://127.0.0.1:{hash_port}",
                                            bases)
        finally:
            if nginx_proc is not None:
                nginx_proc.send_signal(signal.SIGQUIT)
                nginx_proc.wait(timeout=30)
            for p in procs:
                p.send_signal(signal.SIGTERM)
                p.communicate(timeout=60)

    failures = []
    if any(len(s) != 1 for s in hash_seen):
        failures.append(f"prefix-hash routing split a conversation over replicas: {hash_seen}")
    if not all(len(s) == 2 for s in rr_seen):
        failures.append(f"round-robin did not move each conversation between replicas: {rr_seen}")
    if not hash_rate > rr_rate + 0.1:
        failures.append(f"prefix-hash hit rate {hash_rate:.3f} is not well above round-robin's "
                        f"{rr_rate:.3f}")
    for p in procs:
        if p.returncode != 0:
            failures.append(f"kiln-server exited {p.returncode}")
    print(f"server_scaleout_test: {time.monotonic() - t0:.1f} s in all")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
