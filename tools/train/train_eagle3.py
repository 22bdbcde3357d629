"""Trains an EAGLE-3 head on multi-layer features captured by `kiln-features --layers`, then
exports the head file that `kiln --strategy eagle:PATH` loads (docs/speculative.md has the format).

  python3 tools/train/train_eagle3.py --model MODEL --data PREFIX [--data PREFIX ...] --out DIR
      [--minutes 60] [--max-steps N] [--batch 16] [--steps-ahead 3] [--lr 3e-4] [--seed 0]
  python3 tools/train/train_eagle3.py --model MODEL --data PREFIX --out DIR --export HEAD.gguf
      [--eval-data PREFIX ...]

JAX on the CPU, like train_eagle.py (training only). The head is the one kiln runs
(lib/spec/eagle_strategy.h, EAGLE-3): the target's feature at position i is
f_i = fuse [h_low; h_mid; h_high] (the outputs of three target layers, --layers, by default
1, n_layer / 2 - 1 and n_layer - 4 as SpecForge picks them), entry i reads
x_i = fc [E(t_{i+1}); RMSNorm(phi_i) w_feature] + b with phi_i = f_i, one llama block of the
target's shape turns it into g_i, and the head's own LM head over a reduced vocabulary (the --vocab
tokens most frequent in the training answers, initialised from the target's rows) drafts
t_{i+2} from RMSNorm(g_i) w_output. Deeper drafts read the head's own output: a node one level
down reads phi = the g of its parent.

Training-time test (EAGLE-3): each step unrolls the head --steps-ahead times. Unroll 1 reads the
target's features (teacher); unroll k reads phi_i = g^(k-1)_{i-1}, the previous unroll's output at
the position before, and attends to the unroll-1 entries up to position i - k + 1 plus its own
chain of drafted entries (unroll s at position i - (k - s)), exactly the K/V a depth-k tree node
sees in kiln's head cache. The loss is the cross-entropy of t_{i+2} at every unroll (weights
0.8^(k-1)); there is no feature regression (the head's outputs need not be the target's
features, which is what frees its LM head). The last 10% of the samples (in index order) are held
out: the log reports top-1 per unroll on them (unroll k: the depth-k draft's accuracy when its
ancestors were right).

Rows of a sample are consecutive positions from the prompt's last token on, as kiln's head sees
them; RoPE depends only on distances, so training numbers them from 0.

Resumable: DIR/checkpoint.npz (weights, Adam state, step, RNG key), written every
--checkpoint-every steps and at the end; a rerun continues until --minutes of training in total.
"""
import argparse
import os
import time

import numpy as np

import gguf
import jax
import jax.numpy as jnp

from train_eagle import (adam_update, batch_arrays, finish, head_writer, load_checkpoint,
                         load_samples, rms_norm, rope, save_checkpoint, target_shape)
from train_medusa import load_lm_head

MATRICES = ("fuse", "fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# Head-file tensor names (docs/speculative.md) of each parameter; lm_head is written with the
# reduced vocabulary's ids.
TENSOR_NAMES = {
    "fuse": "eagle3.fuse.weight", "feature_norm": "eagle3.feature_norm.weight",
    "fc": "eagle3.fc.weight", "fc_b": "eagle3.fc.bias", "attn_norm": "eagle3.attn_norm.weight",
    "wq": "eagle3.attn_q.weight", "wk": "eagle3.attn_k.weight", "wv": "eagle3.attn_v.weight",
    "wo": "eagle3.attn_output.weight", "ffn_norm": "eagle3.ffn_norm.weight",
    "w_gate": "eagle3.ffn_gate.weight", "w_up": "eagle3.ffn_up.weight",
    "w_down": "eagle3.ffn_down.weight", "output_norm": "eagle3.output_norm.weight",
}


def default_layers(n_layer):
    return [1, n_layer // 2 - 1, n_layer - 4]


def output_norm(model_path):
    r = gguf.GGUFReader(model_path)
    t = next(t for t in r.tensors if t.name == "output_norm.weight")
    return np.asarray(t.data, dtype=np.float32).reshape(-1)


def init_params(shape, key, n_layers, lm_rows, out_norm):
    """Starts where the head drafts like the target's last captured layer: fuse picks the
    highest layer, fc passes the feature through, the block adds nothing, the LM head and its
    norm are the target's."""
    d, hd, ff = shape["n_embd"], shape["head_dim"], shape["n_ff"]
    q_dim, kv_dim = shape["n_head"] * hd, shape["n_head_kv"] * hd
    ks = jax.random.split(key, 8)

    def normal(k, n_out, n_in):
        return jax.random.normal(k, (n_out, n_in), jnp.float32) / np.sqrt(n_in)

    fuse = jnp.concatenate([jnp.zeros((d, (n_layers - 1) * d)), jnp.eye(d)], axis=1)
    return {
        "fuse": fuse, "feature_norm": jnp.ones(d),
        "fc": jnp.concatenate([jnp.zeros((d, d)), jnp.eye(d)], axis=1), "fc_b": jnp.zeros(d),
        "attn_norm": jnp.ones(d), "ffn_norm": jnp.ones(d),
        "wq": normal(ks[0], q_dim, d), "wk": normal(ks[1], kv_dim, d), "wv": normal(ks[2], kv_dim, d),
        "wo": jnp.zeros((d, q_dim)), "w_gate": normal(ks[3], ff, d), "w_up": normal(ks[4], ff, d),
        "w_down": jnp.zeros((d, ff)), "output_norm": jnp.asarray(out_norm),
        "lm_head": jnp.asarray(lm_rows),
    }


def shift_right(x, n):
    """x[:, i] -> x[:, i - n] (zeros before the start).  x: [B, T, ...]"""
    if n == 0:
        return x
    pad = [(0, 0), (n, 0)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad)[:, :x.shape[1]]


def unroll_block(p, shape, x, keys, values):
    """One unroll of the head's layer. keys / values: the earlier unrolls' [B, T, H, hd] (GQA
    expanded); this unroll's are appended. Unroll k = len(keys) after the append: entry i attends
    to unroll 1's entries j <= i - (k - 1) and to unroll s's entry i - (k - s), s = 2..k."""
    B, T, d = x.shape
    H, Hkv, hd, eps = shape["n_head"], shape["n_head_kv"], shape["head_dim"], shape["rms_eps"]
    h = rms_norm(x, p["attn_norm"], eps)
    q = rope((h @ p["wq"].T).reshape(B, T, H, hd), shape["freq_base"])
    k = rope((h @ p["wk"].T).reshape(B, T, Hkv, hd), shape["freq_base"])
    v = (h @ p["wv"].T).reshape(B, T, Hkv, hd)
    keys.append(jnp.repeat(k, H // Hkv, axis=2))  # head j reads KV head j / (H / Hkv)
    values.append(jnp.repeat(v, H // Hkv, axis=2))
    unroll = len(keys)
    scale = 1.0 / np.sqrt(hd)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, keys[0]) * scale  # [B, H, T, T]
    i = jnp.arange(T)[:, None]
    j = jnp.arange(T)[None, :]
    s = jnp.where((j <= i - (unroll - 1))[None, None], s, -jnp.inf)
    chain_k = [shift_right(keys[u], unroll - 1 - u) for u in range(1, unroll)]
    chain_v = [shift_right(values[u], unroll - 1 - u) for u in range(1, unroll)]
    diag = [jnp.einsum("bqhd,bqhd->bhq", q, kk)[..., None] * scale for kk in chain_k]
    w = jax.nn.softmax(jnp.concatenate([s] + diag, axis=-1), axis=-1)  # [B, H, T, T + unroll - 1]
    a = jnp.einsum("bhqk,bkhd->bqhd", w[..., :T], values[0])
    for c, vv in enumerate(chain_v):
        a = a + jnp.transpose(w[..., T + c], (0, 2, 1))[..., None] * vv
    x = x + a.reshape(B, T, H * hd) @ p["wo"].T
    h = rms_norm(x, p["ffn_norm"], eps)
    return x + (jax.nn.silu(h @ p["w_gate"].T) * (h @ p["w_up"].T)) @ p["w_down"].T


def make_loss(shape, steps_ahead):
    """loss(p, tok, feat, length, embd, target_of): target_of maps a token id to its row of the
    head's LM head (-1: outside the draft vocabulary, the position does not count)."""
    eps = shape["rms_eps"]

    def loss_fn(p, tok, feat, length, embd, target_of):
        T = tok.shape[1] - 1
        f = feat[:, :-1] @ p["fuse"].T  # [B, T, d]  f_i
        emb = embd[tok[:, 1:]]  # [B, T, d]  E(t_{i+1})
        i = jnp.arange(T - 1)[None, :]
        target = target_of[tok[:, 2:]]  # [B, T - 1]  t_{i+2}
        keys, values = [], []
        phi, total = f, 0.0
        stats = []
        for k in range(1, steps_ahead + 1):
            if k > 1:
                phi = shift_right(g, 1)  # entry i reads the previous unroll's g at i - 1
            x = jnp.concatenate([emb, rms_norm(phi, p["feature_norm"], eps)], axis=-1) @ p["fc"].T
            g = unroll_block(p, shape, x + p["fc_b"], keys, values)  # [B, T, d]
            logits = rms_norm(g[:, :-1], p["output_norm"], eps) @ p["lm_head"].T  # [B, T-1, V']
            mask = ((i >= k - 1) & (i + 2 < length[:, None]) & (target >= 0)).astype(jnp.float32)
            logp = jax.nn.log_softmax(logits, axis=-1)
            nll = -jnp.take_along_axis(logp, jnp.maximum(target, 0)[..., None], axis=-1)[..., 0]
            ce = (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)
            total = total + 0.8 ** (k - 1) * ce
            correct = ((jnp.argmax(logits, -1) == target) * mask).sum()
            # Positions scored, the target in the draft vocabulary or not (a miss when not).
            scored = ((i >= k - 1) & (i + 2 < length[:, None])).sum()
            stats.append(jnp.stack([ce, correct, scored.astype(jnp.float32)]))
        return total, jnp.stack(stats)  # stats: [steps_ahead, (ce, correct, scored)]
    return loss_fn


def evaluate(eval_fn, p, samples, idx, batch, max_rows, embd, target_of):
    """Top-1 per unroll over `idx` (every scored position; a target outside the draft vocabulary
    is a miss)."""
    correct = scored = 0.0
    for s in range(0, len(idx), batch):
        tok, feat, length = batch_arrays(samples, idx[s:s + batch], max_rows)
        _, st = eval_fn(p, tok, feat, length, embd, target_of)
        st = np.asarray(st)
        correct, scored = correct + st[:, 1], scored + st[:, 2]
    return correct / np.maximum(scored, 1.0)


def export(path, p, shape, fp, layers, subset, lm_dtype):
    w = head_writer(path, "eagle3", fp, shape)
    w.add_array("eagle3.target.layers", [int(x) for x in layers])
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, tensor in TENSOR_NAMES.items():
        x = np.asarray(p[name], dtype=np.float32)
        if name in MATRICES:
            w.add_tensor(tensor, gguf.quants.quantize(x, q8), raw_dtype=q8)
        else:
            w.add_tensor(tensor, x)
    w.add_array("eagle3.vocab.ids", [int(x) for x in subset])
    lm = np.asarray(p["lm_head"], dtype=np.float32)
    if lm_dtype == "q8_0":
        w.add_tensor("eagle3.lm_head.weight", gguf.quants.quantize(lm, q8), raw_dtype=q8)
    else:
        w.add_tensor("eagle3.lm_head.weight", lm.astype(np.float16))
    finish(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", action="append", required=True,
                    help="kiln-features --layers output prefix")
    ap.add_argument("--out", required=True, help="checkpoint directory")
    ap.add_argument("--layers", help="the target layers the features hold (default: 1, "
                                     "n_layer / 2 - 1, n_layer - 4)")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16, help="samples per step")
    ap.add_argument("--max-rows", type=int, default=160, help="rows per sample (longer are cut)")
    ap.add_argument("--steps-ahead", type=int, default=3, help="training-time test unrolls")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--vocab", type=int, default=8192,
                    help="the head's draft vocabulary: the V tokens most frequent in the "
                         "training samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--export", help="write the head file from the checkpoint and exit")
    ap.add_argument("--eval-data", action="append", default=[],
                    help="at export, also the top-1 per unroll on these kiln-features outputs")
    ap.add_argument("--lm-head-type", choices=["q8_0", "f16"], default="q8_0")
    args = ap.parse_args()

    shape, embd = target_shape(args.model)
    lm_full, fp = load_lm_head(args.model)
    layers = ([int(x) for x in args.layers.split(",")] if args.layers
              else default_layers(fp["n_layer"]))
    samples = load_samples(args.data, args.max_rows)
    width = samples[0][1].shape[1]
    if width != len(layers) * shape["n_embd"]:
        raise SystemExit(f"train_eagle3: features of width {width}, expected {len(layers)} layers "
                         f"x {shape['n_embd']} (kiln-features --layers {','.join(map(str, layers))})")
    n_val = max(1, len(samples) // 10)
    train_idx = np.arange(len(samples) - n_val)
    val_idx = np.arange(len(samples) - n_val, len(samples))
    n_vocab = lm_full.shape[0]
    freq = np.bincount(np.concatenate([samples[i][0] for i in train_idx]), minlength=n_vocab)
    subset = np.sort(np.argsort(-freq, kind="stable")[:args.vocab])
    target_of = np.full(n_vocab, -1, np.int32)
    target_of[subset] = np.arange(subset.size, dtype=np.int32)
    embd, target_of = jnp.asarray(embd), jnp.asarray(target_of)
    loss_fn = make_loss(shape, args.steps_ahead)
    eval_fn = jax.jit(loss_fn)
    os.makedirs(args.out, exist_ok=True)
    ck = os.path.join(args.out, "checkpoint.npz")
    if os.path.exists(ck):
        p, m, v, step, seconds, key = load_checkpoint(ck)
    else:
        key = jax.random.key(args.seed)
        key, init_key = jax.random.split(key)
        p = init_params(shape, init_key, len(layers), lm_full[subset], output_norm(args.model))
        m = jax.tree_util.tree_map(jnp.zeros_like, p)
        v = jax.tree_util.tree_map(jnp.zeros_like, p)
        step, seconds = 0, 0.0
    fmt = lambda acc: " ".join(f"{a:.4f}" for a in acc)
    if args.export:
        acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd, target_of)
        print(f"step {step}: held-out top-1 per unroll {fmt(acc)} over {len(val_idx)} samples")
        for prefix in args.eval_data:
            ev = load_samples([prefix], args.max_rows)
            acc = evaluate(eval_fn, p, ev, np.arange(len(ev)), args.batch, args.max_rows, embd,
                           target_of)
            print(f"--eval-data {prefix}: top-1 per unroll {fmt(acc)} over {len(ev)} samples")
        export(args.export, p, shape, fp, layers, subset, args.lm_head_type)
        print(f"wrote {args.export}")
        return

    @jax.jit
    def train_step(p, m, v, step, tok, feat, length, embd, target_of):
        (loss, st), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            p, tok, feat, length, embd, target_of)
        warm = jnp.minimum(1.0, (step + 1) / 100.0)
        p, m, v, norm = adam_update(p, grads, m, v, step, args.lr * warm)
        return p, m, v, loss, st, norm

    print(f"{len(samples)} samples ({len(train_idx)} train, {len(val_idx)} held out), "
          f"{sum(len(s[0]) for s in samples)} rows; layers {layers}; step {step}, "
          f"{seconds / 60:.1f} min so far", flush=True)
    rng = np.random.default_rng(args.seed + step)
    begin = time.time() - seconds
    while True:
        seconds = time.time() - begin
        if seconds >= args.minutes * 60 or (args.max_steps and step >= args.max_steps):
            break
        idx = rng.choice(train_idx, size=min(args.batch, len(train_idx)), replace=False)
        tok, feat, length = batch_arrays(samples, idx, args.max_rows)
        p, m, v, loss, st, norm = train_step(p, m, v, step, tok, feat, length, embd, target_of)
        step += 1
        if step % 10 == 0:
            st = np.asarray(st)
            print(f"step {step} {seconds / 60:.1f} min: loss {float(loss):.4f} ce "
                  f"{fmt(st[:, 0])} top1 {fmt(st[:, 1] / np.maximum(st[:, 2], 1))} "
                  f"|g| {float(norm):.2f}", flush=True)
        if step % args.eval_every == 0:
            acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd,
                           target_of)
            print(f"step {step}: held-out top-1 per unroll {fmt(acc)}", flush=True)
        if step % args.checkpoint_every == 0:
            save_checkpoint(ck, p, m, v, step, time.time() - begin, key)
    save_checkpoint(ck, p, m, v, step, time.time() - begin, key)
    acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd, target_of)
    print(f"done: step {step}, {(time.time() - begin) / 60:.1f} min, held-out top-1 per unroll "
          f"{fmt(acc)}")


if __name__ == "__main__":
    main()
