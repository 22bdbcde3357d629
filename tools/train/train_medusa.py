"""Steps 3 and 4: train Medusa heads on features captured by kiln-features, then export the head
file that `kiln --strategy medusa:PATH` loads (lib/spec/medusa_strategy.h has the format).

  python3 tools/train/train_medusa.py --model MODEL --data PREFIX --out DIR [--heads 3]
      [--minutes 30] [--max-steps N] [--batch 256] [--lr 1e-3] [--seed 0] [--negatives N]
      [--vocab V]
  python3 tools/train/train_medusa.py --model MODEL --data PREFIX --out DIR --export HEAD.gguf
      [--tree-size 12] [--pass-costs C1,C2,.. | --pass-cost-beta 0.1] [--vocab V]
      [--eval-data PREFIX]

Numpy only, with hand-written gradients (no PyTorch needed). Head j (0-based) reads the target's
final hidden state h at position p and predicts the token at p + 2 + j (the target's LM head
predicts p + 1): z = h + SiLU(W h + b), logits = E z with E the target's LM head (here the tied
embeddings), frozen. W and b start at zero (each head starts as the LM head itself), Adam,
cross-entropy over the full vocabulary or (--negatives N) over the data's target tokens plus N
random others per step. The last 10% of the samples (in index order) are held
out: the acceptance table (how often the target's token is the head's r-th candidate, per head
and rank) is measured there and chooses the static tree.

--vocab V (reduced-vocabulary heads, head-file format version 2): the heads score only the V
tokens most frequent in the training samples (ties to the lower id; kept in the checkpoint), with
their own copy of the target's LM-head rows for them in the target's own type, so proposing costs
V / n_vocab of the full LM head. Training then uses the full softmax over those V tokens, and
positions whose target is outside them do not count. --vocab at export with a checkpoint trained
without it cuts that checkpoint's heads to the subset. --eval-data measures the acceptance table
(and so the tree) on all samples of another kiln-features output instead of the held-out 10%.

Resumable: DIR/checkpoint.npz holds weights, Adam state, the step and the RNG state, written
every --checkpoint-every steps and at the end; a rerun continues from it until --minutes of
training time in total have been spent.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import gguf


def lm_head_tensor(reader):
    tensors = {t.name: t for t in reader.tensors}
    return tensors.get("output.weight", tensors["token_embd.weight"])


def load_lm_head(model_path):
    r = gguf.GGUFReader(model_path)
    t = lm_head_tensor(r)
    E = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)  # [V, d]
    f = r.fields["tokenizer.ggml.tokens"]
    h = 0xCBF29CE484222325
    for i in f.data:
        for c in bytes(f.parts[i]):
            h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        h = ((h ^ 0xFF) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_layer = int(r.fields[f"{arch}.block_count"].parts[-1][0])
    return E, {"vocab_hash": h, "vocab_size": E.shape[0], "n_embd": E.shape[1], "n_layer": n_layer}


def load_data(prefix, n_heads):
    counts = [int(x) for x in open(prefix + ".index").read().split()]
    tokens = np.fromfile(prefix + ".tokens", dtype=np.int32)
    feats = np.fromfile(prefix + ".features", dtype=np.float16)
    d = feats.size // tokens.size
    feats = feats.reshape(tokens.size, d)
    # (row of the feature, target tokens of every head) for rows with all targets inside the sample
    rows, targets, sample_of = [], [], []
    start = 0
    for s, n in enumerate(counts):
        for i in range(n - 1 - n_heads):
            rows.append(start + i)
            targets.append(tokens[start + i + 2: start + i + 2 + n_heads])
            sample_of.append(s)
        start += n
    return feats, np.array(rows), np.array(targets, dtype=np.int64), np.array(sample_of), len(counts)


def vocab_subset(prefix, n_samples_used, size):
    """The `size` tokens most frequent in the first n_samples_used samples (ties to the lower id),
    ascending: the reduced vocabulary of --vocab."""
    counts = [int(x) for x in open(prefix + ".index").read().split()]
    tokens = np.fromfile(prefix + ".tokens", dtype=np.int32)[: sum(counts[:n_samples_used])]
    freq = np.bincount(tokens)
    order = np.lexsort((np.arange(len(freq)), -freq))  # by count descending, then id
    return np.sort(order[: min(size, int((freq > 0).sum()))]).astype(np.int64)


def silu(a):
    return a / (1.0 + np.exp(-a))


def head_forward(W, b, X):
    a = X @ W.T + b
    sig = 1.0 / (1.0 + np.exp(-a))
    return X + a * sig, a, sig


def train(args):
    E, fp = load_lm_head(args.model)
    feats, rows, targets, sample_of, n_samples = load_data(args.data, args.heads)
    n_train_samples = int(n_samples * 0.9)
    train_idx = np.nonzero(sample_of < n_train_samples)[0]
    d = E.shape[1]
    K = args.heads
    os.makedirs(args.out, exist_ok=True)
    ck = os.path.join(args.out, "checkpoint.npz")
    rng = np.random.default_rng(args.seed)
    if os.path.exists(ck):
        z = np.load(ck, allow_pickle=True)
        W, b, mW, vW, mb, vb = (z[k] for k in ("W", "b", "mW", "vW", "mb", "vb"))
        step, spent = int(z["step"]), float(z["spent"])
        rng.bit_generator.state = z["rng"].item()
        vocab = z["vocab"] if "vocab" in z and z["vocab"].size else None
        print(f"resumed at step {step}, {spent / 60:.1f} min spent", flush=True)
    else:
        W = np.zeros((K, d, d), np.float32)
        b = np.zeros((K, d), np.float32)
        mW, vW, mb, vb = (np.zeros_like(x) for x in (W, b, W, b))
        mW, vW = np.zeros_like(W), np.zeros_like(W)
        mb, vb = np.zeros_like(b), np.zeros_like(b)
        step, spent = 0, 0.0
        vocab = vocab_subset(args.data, n_train_samples, args.vocab) if args.vocab else None
    data_vocab = np.unique(targets)
    print(f"data: {n_samples} samples, {len(rows)} positions ({len(train_idx)} for training), "
          f"d {d}, vocab {E.shape[0]}", flush=True)

    def save():  # atomic: a reader (or a crash) never sees half a checkpoint
        tmp = ck + ".tmp.npz"
        np.savez(tmp, W=W, b=b, mW=mW, vW=vW, mb=mb, vb=vb, step=step, spent=spent,
                 rng=np.array(rng.bit_generator.state, dtype=object),
                 vocab=vocab if vocab is not None else np.zeros(0, np.int64))
        os.replace(tmp, ck)

    b1, b2, eps = 0.9, 0.999, 1e-8
    losses = []
    t_last = time.time()
    while spent < args.minutes * 60 and (args.max_steps == 0 or step < args.max_steps):
        batch = rng.choice(train_idx, size=args.batch, replace=False)
        X = feats[rows[batch]].astype(np.float32)  # [B, d]
        step += 1
        if vocab is not None:
            # Full softmax over the reduced vocabulary; targets outside it are masked below.
            E_step = E[vocab]
            pos = np.minimum(np.searchsorted(vocab, targets[batch]), len(vocab) - 1)
            inside = vocab[pos] == targets[batch]  # [B, K]
            y_all = np.where(inside, pos, 0)
        elif args.negatives > 0:
            # Sampled softmax: the tokens the data has as targets plus `negatives` uniform others
            # (drawn afresh each step), instead of all 49k: ~10x cheaper on 2 cores.
            cand = np.unique(np.concatenate([data_vocab, rng.integers(0, E.shape[0],
                                                                      args.negatives)]))
            E_step = E[cand]
            y_all = np.searchsorted(cand, targets[batch])
        else:
            E_step, y_all = E, targets[batch]
        for j in range(K):
            Z, a, sig = head_forward(W[j], b[j], X)
            logits = Z @ E_step.T  # [B, V or candidates]
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            y = y_all[:, j]
            mask = inside[:, j] if vocab is not None else np.ones(len(y), bool)
            losses.append(-np.log(p[np.arange(len(y)), y] + 1e-12)[mask].mean())
            p[np.arange(len(y)), y] -= 1.0
            p[~mask] = 0.0
            p /= max(1, mask.sum())
            dZ = p @ E_step  # [B, d]
            da = dZ * (sig * (1.0 + a * (1.0 - sig)))  # d silu(a) / da
            gW = da.T @ X
            gb = da.sum(axis=0)
            lr = args.lr
            for param, g, m, v in ((W[j], gW, mW[j], vW[j]), (b[j], gb, mb[j], vb[j])):
                m *= b1
                m += (1 - b1) * g
                v *= b2
                v += (1 - b2) * g * g
                param -= lr * (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)
        now = time.time()
        spent += now - t_last
        t_last = now
        if step % 20 == 0:
            tail = np.array(losses[-20 * K:]).reshape(-1, K).mean(axis=0)
            print(f"step {step} {spent / 60:.1f} min loss per head " +
                  " ".join(f"{x:.3f}" for x in tail), flush=True)
        if step % args.checkpoint_every == 0:
            save()
    save()
    print(f"done: {step} steps of {args.batch}, {spent / 60:.1f} min", flush=True)


def acceptance_table(W, b, E, vocab, feats, rows, targets, val, max_rank=8):
    """acc[j][r]: fraction of positions `val` where the target token is head j's r-th candidate
    (scored over `vocab` only when given)."""
    if vocab is not None:
        E = E[vocab]
    K = W.shape[0]
    acc = np.zeros((K, max_rank))
    for s in range(0, len(val), 256):
        idx = val[s:s + 256]
        X = feats[rows[idx]].astype(np.float32)
        for j in range(K):
            Z, _, _ = head_forward(W[j], b[j], X)
            logits = Z @ E.T
            part = np.argpartition(-logits, max_rank, axis=1)[:, :max_rank]
            order = np.argsort(-np.take_along_axis(logits, part, axis=1), axis=1, kind="stable")
            top = np.take_along_axis(part, order, axis=1)
            if vocab is not None:
                top = vocab[top]
            acc[j] += (top == targets[idx, j][:, None]).sum(axis=0)
    return acc / max(1, len(val)), len(val)


def pass_cost(costs, beta, width):
    """c(width): what a target pass over `width` tokens costs relative to a one-token pass. From
    the measured curve `costs` (costs[w - 1] = c(w), engine_bench --widths --tree) when given,
    continued past its end with its last slope; else the line 1 + beta (width - 1)."""
    if not costs:
        return 1.0 + beta * (width - 1)
    if width <= len(costs):
        return costs[width - 1]
    slope = costs[-1] - costs[-2] if len(costs) > 1 else beta
    return costs[-1] + slope * (width - len(costs))


def choose_tree(acc, tree_size, beta, costs=None):
    """Best-first tree by path probability (product of acc along the path, as Medusa does), cut at
    the size n maximising (1 + expected accepted) / c(1 + n) (pass_cost), at most tree_size. n = 0
    (no tree: plain decoding) wins when no tree pays for its pass."""
    K, R = acc.shape
    nodes = []  # (prob, parent, rank, depth)
    frontier = [(acc[0][r], -1, r, 1) for r in range(R)]
    while frontier and len(nodes) < tree_size:
        frontier.sort(key=lambda x: -x[0])
        prob, parent, rank, depth = frontier.pop(0)
        nodes.append((prob, parent, rank, depth))
        me = len(nodes) - 1
        if depth < K:
            frontier += [(prob * acc[depth][r], me, r, depth + 1) for r in range(R)]
    best, best_n, expected = 1.0, 0, 0.0
    for n in range(1, len(nodes) + 1):
        expected += nodes[n - 1][0]
        gain = (1 + expected) / pass_cost(costs, beta, 1 + n)
        if gain > best:
            best, best_n = gain, n
    return nodes[:best_n], best


def export(args):
    E, fp = load_lm_head(args.model)
    with np.load(os.path.join(args.out, "checkpoint.npz"), allow_pickle=True) as f:
        z = {k: f[k] for k in ("W", "b", "step", "spent")}
        vocab = f["vocab"] if "vocab" in f and f["vocab"].size else None
    W, b = z["W"], z["b"]
    K, d = W.shape[0], W.shape[1]
    feats, rows, targets, sample_of, n_samples = load_data(args.data, K)
    if vocab is None and args.vocab:
        vocab = vocab_subset(args.data, int(n_samples * 0.9), args.vocab)
    if args.eval_data:
        feats, rows, targets, sample_of, n_samples = load_data(args.eval_data, K)
        val = np.arange(len(rows))
    else:
        val = np.nonzero(sample_of >= int(n_samples * 0.9))[0]
    acc, n_val = acceptance_table(W, b, E, vocab, feats, rows, targets, val)
    costs = [float(x) for x in args.pass_costs.split(",")] if args.pass_costs else None
    if costs and (len(costs) < 2 or abs(costs[0] - 1.0) > 1e-6):
        sys.exit("--pass-costs: c(1), c(2), ... with c(1) = 1 (engine_bench --widths --tree)")
    nodes, gain = choose_tree(acc, args.tree_size, args.pass_cost_beta, costs)
    if not nodes:
        sys.exit(f"no tree pays for its pass (best expected speedup with one node or more is "
                 f"below 1 at these pass costs); acceptance per head and rank: {acc.tolist()}")
    report = {
        "held_out_positions": n_val,
        "eval_data": args.eval_data or "the held-out 10% of --data",
        "vocab_size": int(len(vocab)) if vocab is not None else int(E.shape[0]),
        "acceptance_per_head_rank": [[round(float(x), 4) for x in row] for row in acc],
        "tree_parents": [n[1] for n in nodes],
        "tree_ranks": [n[2] for n in nodes],
        "tree_expected_accepted": round(float(sum(n[0] for n in nodes)), 3),
        "tree_expected_speedup": round(float(gain), 3),
        "pass_costs": costs if costs else f"1 + {args.pass_cost_beta} (w - 1)",
        "steps": int(z["step"]),
        "train_minutes": round(float(z["spent"]) / 60, 1),
    }
    print(json.dumps(report, indent=1))
    with open(os.path.join(args.out, "export_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    w = gguf.GGUFWriter(args.export, "medusa")
    w.add_uint32("medusa.format_version", 2)
    w.add_uint32("medusa.head_count", K)
    w.add_uint32("medusa.embedding_length", d)
    w.add_uint64("medusa.target.vocab_hash", fp["vocab_hash"])
    w.add_uint32("medusa.target.vocab_size", fp["vocab_size"])
    w.add_uint32("medusa.target.embedding_length", fp["n_embd"])
    w.add_uint32("medusa.target.block_count", fp["n_layer"])
    w.add_array("medusa.tree.parents", [int(n[1]) for n in nodes])
    w.add_array("medusa.tree.ranks", [int(n[2]) for n in nodes])
    for j in range(K):
        w.add_tensor(f"medusa.{j}.weight", W[j].astype(np.float16))
        w.add_tensor(f"medusa.{j}.bias", b[j].astype(np.float32))
    if vocab is not None:
        # The target's own LM-head rows for the subset, bytes unchanged (its quant type).
        t = lm_head_tensor(gguf.GGUFReader(args.model))
        w.add_array("medusa.vocab.ids", [int(x) for x in vocab])
        w.add_tensor("medusa.lm_head.weight", np.ascontiguousarray(t.data[vocab]),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.export} ({os.path.getsize(args.export)} bytes)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="kiln-features output prefix")
    ap.add_argument("--out", required=True, help="checkpoint directory")
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--max-steps", type=int, default=0,
                    help="stop after this many steps in total (0: only --minutes); for reproducing")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--negatives", type=int, default=0,
                    help="0: full-vocabulary softmax; N: the data's target tokens plus N random "
                         "others per step (sampled softmax)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="reduced-vocabulary heads over the V most frequent training tokens")
    ap.add_argument("--eval-data", help="kiln-features output to measure acceptance on (export)")
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--export", help="write the head file here instead of training")
    ap.add_argument("--tree-size", type=int, default=16)
    ap.add_argument("--pass-cost-beta", type=float, default=0.1,
                    help="relative cost of each extra token in a target pass (draft_policy.h); "
                         "used when --pass-costs is not given")
    ap.add_argument("--pass-costs",
                    help="the measured c(w), w = 1, 2, ..: a pass over w tokens relative to one "
                         "token, comma-separated, as `engine_bench --widths --tree` prints it")
    args = ap.parse_args()
    if args.export:
        export(args)
    else:
        train(args)


if __name__ == "__main__":
    sys.exit(main())
