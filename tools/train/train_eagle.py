"""Trains an EAGLE-1 head on features captured by kiln-features, then exports the head file that
`kiln --strategy eagle:PATH` loads (docs/speculative.md has the format).

  python3 tools/train/train_eagle.py --model MODEL --data PREFIX [--data PREFIX ...] --out DIR
      [--minutes 60] [--max-steps N] [--batch 8] [--lr 3e-4] [--seed 0]
  python3 tools/train/train_eagle.py --model MODEL --data PREFIX --out DIR --export HEAD.gguf
      [--eval-data PREFIX ...]

JAX on the CPU (`pip install jax numpy gguf`; training only, kiln never needs it). The head is
the one kiln runs (lib/spec/eagle_strategy.h): entry i of a sample reads
x_i = fc [E(t_{i+1}); f_i] + b (E the target's token embeddings, f_i the feature of row i, the
target's final hidden state after the output norm, which gave t_{i+1}), one llama block of the
target's shape over the entries before it (RMSNorm, GQA attention with the target's RoPE, SwiGLU),
and its output g_i is the head's guess of f_{i+1}; the target's LM head turns g_i into the draft
distribution of t_{i+2}. Loss as in EAGLE: smooth-L1(g_i, f_{i+1}) + 0.1 cross-entropy of
t_{i+2} over the --vocab most frequent training tokens, with uniform noise on the input features (the head reads its own
guesses beyond depth 1). Training starts from g = f (fc = [0 | I], the block's output projections
zero). The last 10% of the samples (in index order) are held out: the log reports the head's
top-1 accuracy on them (teacher-forced: the share of depth-1 drafts the target would accept).

The exported head drafts over that same reduced vocabulary (--vocab V > 0): eagle.vocab.ids (the
V ids, ascending) and eagle.lm_head.weight (the target's own LM-head rows for them, in its type),
so each draft node costs V / n_vocab of the full LM head; --vocab 0 exports a head that drafts
with the target's full LM head. The head's own matrices are exported as Q8_0 (--matrix-type f16
keeps them f16): a head pass streams them once per draft depth. At export the log also gives the held-out top-1 when drafts are
restricted to the subset (a target outside it counts as a miss), what kiln will see.

Rows of a sample are consecutive positions from the prompt's last token on, as kiln's head sees
them at run time (its context starts at the prompt's last feature); RoPE depends only on the
distance between positions, so training numbers them from 0.

Resumable: DIR/checkpoint.npz holds weights, Adam state, the step and the RNG key, written every
--checkpoint-every steps and at the end; a rerun continues until --minutes of training in total.
"""
import argparse
import os
import sys
import time

import numpy as np

import gguf
import jax
import jax.numpy as jnp

from train_medusa import lm_head_tensor, load_lm_head

MATRICES = ("fc", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# Head-file tensor names (docs/speculative.md) of each parameter.
TENSOR_NAMES = {
    "fc": "eagle.fc.weight", "fc_b": "eagle.fc.bias", "attn_norm": "eagle.attn_norm.weight",
    "wq": "eagle.attn_q.weight", "wk": "eagle.attn_k.weight", "wv": "eagle.attn_v.weight",
    "wo": "eagle.attn_output.weight", "ffn_norm": "eagle.ffn_norm.weight",
    "w_gate": "eagle.ffn_gate.weight", "w_up": "eagle.ffn_up.weight",
    "w_down": "eagle.ffn_down.weight",
}


def field(reader, key):
    return reader.fields[key].parts[-1][0]


def target_shape(model_path):
    """The target's layer shape, norm epsilon and rotation (llama-style NORM RoPE only)."""
    r = gguf.GGUFReader(model_path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_embd = int(field(r, f"{arch}.embedding_length"))
    n_head = int(field(r, f"{arch}.attention.head_count"))
    n_head_kv = int(field(r, f"{arch}.attention.head_count_kv"))
    key_len = f"{arch}.attention.key_length"
    head_dim = int(field(r, key_len)) if key_len in r.fields else n_embd // n_head
    base_key = f"{arch}.rope.freq_base"
    if arch not in ("llama",):
        sys.exit(f"train_eagle: targets of architecture {arch} are not supported (llama RoPE only)")
    tensors = {t.name: t for t in r.tensors}
    t = tensors["token_embd.weight"]
    embd = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)  # [V, d]
    return {
        "n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv, "head_dim": head_dim,
        "n_ff": int(field(r, f"{arch}.feed_forward_length")),
        "rms_eps": float(field(r, f"{arch}.attention.layer_norm_rms_epsilon")),
        "freq_base": float(field(r, base_key)) if base_key in r.fields else 10000.0,
    }, embd


def load_samples(prefixes, max_rows):
    """[(tokens [n] int32, features [n, d] f16)] per sample, cut to max_rows rows."""
    samples = []
    for prefix in prefixes:
        counts = [int(x) for x in open(prefix + ".index").read().split()]
        tokens = np.fromfile(prefix + ".tokens", dtype=np.int32)
        feats = np.fromfile(prefix + ".features", dtype=np.float16).reshape(tokens.size, -1)
        start = 0
        for n in counts:
            m = min(n, max_rows)
            if m >= 3:
                samples.append((tokens[start:start + m], feats[start:start + m]))
            start += n
    return samples


def batch_arrays(samples, idx, max_rows):
    d = samples[0][1].shape[1]
    tok = np.zeros((len(idx), max_rows), np.int32)
    feat = np.zeros((len(idx), max_rows, d), np.float32)
    length = np.zeros(len(idx), np.int32)
    for b, i in enumerate(idx):
        t, f = samples[i]
        tok[b, :len(t)] = t
        feat[b, :len(t)] = f
        length[b] = len(t)
    return jnp.asarray(tok), jnp.asarray(feat), jnp.asarray(length)


def init_params(shape, key):
    d, hd, ff = shape["n_embd"], shape["head_dim"], shape["n_ff"]
    q_dim, kv_dim = shape["n_head"] * hd, shape["n_head_kv"] * hd
    ks = jax.random.split(key, 8)

    def normal(k, n_out, n_in):
        return jax.random.normal(k, (n_out, n_in), jnp.float32) / np.sqrt(n_in)

    fc = jnp.concatenate([jnp.zeros((d, d)), jnp.eye(d)], axis=1)  # [d, 2d]: g = f at first
    return {
        "fc": fc, "fc_b": jnp.zeros(d), "attn_norm": jnp.ones(d), "ffn_norm": jnp.ones(d),
        "wq": normal(ks[0], q_dim, d), "wk": normal(ks[1], kv_dim, d), "wv": normal(ks[2], kv_dim, d),
        "wo": jnp.zeros((d, q_dim)), "w_gate": normal(ks[3], ff, d), "w_up": normal(ks[4], ff, d),
        "w_down": jnp.zeros((d, ff)),
    }


def rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, freq_base):
    """llama.cpp's NORM rotation of pairs (2i, 2i + 1) at positions 0..T-1.  x: [B, T, H, hd]"""
    T, hd = x.shape[1], x.shape[3]
    inv = freq_base ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)  # [hd / 2]
    ang = jnp.arange(T, dtype=jnp.float32)[:, None] * inv[None, :]   # [T, hd / 2]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)


def head_forward(p, shape, emb_next, feat_in):
    """g for every entry.  emb_next, feat_in: [B, T, d]  ->  g: [B, T, d]"""
    B, T, d = feat_in.shape
    H, Hkv, hd, eps = shape["n_head"], shape["n_head_kv"], shape["head_dim"], shape["rms_eps"]
    x = jnp.concatenate([emb_next, feat_in], axis=-1) @ p["fc"].T + p["fc_b"]
    h = rms_norm(x, p["attn_norm"], eps)
    q = rope((h @ p["wq"].T).reshape(B, T, H, hd), shape["freq_base"])
    k = rope((h @ p["wk"].T).reshape(B, T, Hkv, hd), shape["freq_base"])
    v = (h @ p["wv"].T).reshape(B, T, Hkv, hd)
    k = jnp.repeat(k, H // Hkv, axis=2)  # head j reads KV head j / (H / Hkv), as kiln's GQA
    v = jnp.repeat(v, H // Hkv, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
    causal = jnp.tril(jnp.ones((T, T), bool))
    s = jnp.where(causal[None, None], s, -jnp.inf)
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v).reshape(B, T, H * hd)
    x = x + a @ p["wo"].T
    h = rms_norm(x, p["ffn_norm"], eps)
    return x + (jax.nn.silu(h @ p["w_gate"].T) * (h @ p["w_up"].T)) @ p["w_down"].T


def make_loss(shape, noise):
    """loss(p, tok, feat, length, key, embd, lm_head, target_of): lm_head [V', d] holds the rows of
    the vocabulary the cross-entropy runs over and target_of maps a token id to its row (-1: the
    position does not count)."""
    def loss_fn(p, tok, feat, length, key, embd, lm_head, target_of):
        T = tok.shape[1] - 1
        f_in = feat[:, :-1]
        scale = jnp.sqrt(jnp.mean(f_in * f_in, axis=-1, keepdims=True))
        f_in = f_in + noise * scale * jax.random.uniform(key, f_in.shape, minval=-1.0, maxval=1.0)
        g = head_forward(p, shape, embd[tok[:, 1:]], f_in)  # [B, T, d]
        i = jnp.arange(T)[None, :]
        reg_mask = (i + 1 < length[:, None]).astype(jnp.float32)
        target = target_of[tok[:, 2:]]  # [B, T - 1]
        ce_mask = ((i[:, :-1] + 2 < length[:, None]) & (target >= 0)).astype(jnp.float32)
        target = jnp.maximum(target, 0)
        diff = jnp.abs(g - feat[:, 1:])
        smooth_l1 = jnp.where(diff < 1.0, 0.5 * diff * diff, diff - 0.5).mean(-1)
        reg = (smooth_l1 * reg_mask).sum() / reg_mask.sum()
        logits = g[:, :-1] @ lm_head.T  # [B, T - 1, V]
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
        ce = (nll * ce_mask).sum() / jnp.maximum(ce_mask.sum(), 1.0)
        correct = ((jnp.argmax(logits, -1) == target) * ce_mask).sum()
        return reg + 0.1 * ce, (reg, ce, correct, ce_mask.sum())
    return loss_fn


def adam_update(p, grads, m, v, step, lr, b1=0.9, b2=0.95, eps=1e-8, clip=0.5):
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
    factor = jnp.minimum(1.0, clip / (norm + 1e-6))
    grads = jax.tree_util.tree_map(lambda g: g * factor, grads)
    m = jax.tree_util.tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
    v = jax.tree_util.tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
    t = step + 1
    p = jax.tree_util.tree_map(
        lambda p_, m_, v_: p_ - lr * (m_ / (1 - b1 ** t)) / (jnp.sqrt(v_ / (1 - b2 ** t)) + eps),
        p, m, v)
    return p, m, v, norm


def save_checkpoint(path, p, m, v, step, seconds, key):
    arrays = {f"p_{k}": np.asarray(x) for k, x in p.items()}
    arrays.update({f"m_{k}": np.asarray(x) for k, x in m.items()})
    arrays.update({f"v_{k}": np.asarray(x) for k, x in v.items()})
    tmp = path + ".tmp.npz"
    np.savez(tmp, step=step, seconds=seconds, key=np.asarray(jax.random.key_data(key)), **arrays)
    os.replace(tmp, path)


def load_checkpoint(path):
    z = np.load(path)
    get = lambda prefix: {k[2:]: jnp.asarray(z[k]) for k in z.files if k.startswith(prefix)}
    return (get("p_"), get("m_"), get("v_"), int(z["step"]), float(z["seconds"]),
            jax.random.wrap_key_data(jnp.asarray(z["key"])))


def evaluate(eval_fn, p, samples, val, batch, max_rows, embd, lm_head, subset=None):
    """Held-out top-1 without feature noise: over the full vocabulary, or with `subset` (ascending
    ids) over those tokens only, every position counted (a target outside them is a miss)."""
    n_vocab = lm_head.shape[0]
    every = jnp.arange(n_vocab, dtype=jnp.int32)
    if subset is not None:
        rows = np.full(n_vocab, -1, np.int32)  # targets outside the subset: not scored
        rows[subset] = np.arange(subset.size, dtype=np.int32)
        lm_head, every = lm_head[jnp.asarray(subset)], jnp.asarray(rows)
    correct = total = 0.0
    for s in range(0, len(val), batch):
        tok, feat, length = batch_arrays(samples, val[s:s + batch], max_rows)
        _, (_, _, c, n) = eval_fn(p, tok, feat, length, jax.random.key(0), embd, lm_head, every)
        correct += float(c)
        if subset is None:
            total += float(n)
        else:  # every scored position, the target inside the subset or not
            total += float(np.maximum(np.asarray(length) - 2, 0).sum())
    return correct / max(total, 1.0)


def head_writer(path, arch, fp, shape):
    """A GGUF writer for a head file of `arch` ("eagle" or "eagle3") with the target's
    fingerprint and the layer's shape keys (docs/speculative.md)."""
    w = gguf.GGUFWriter(path, arch)
    w.add_uint64(f"{arch}.target.vocab_hash", fp["vocab_hash"])
    w.add_uint32(f"{arch}.target.vocab_size", fp["vocab_size"])
    w.add_uint32(f"{arch}.target.embedding_length", fp["n_embd"])
    w.add_uint32(f"{arch}.target.block_count", fp["n_layer"])
    w.add_uint32(f"{arch}.embedding_length", shape["n_embd"])
    w.add_uint32(f"{arch}.attention.head_count", shape["n_head"])
    w.add_uint32(f"{arch}.attention.head_count_kv", shape["n_head_kv"])
    w.add_uint32(f"{arch}.attention.key_length", shape["head_dim"])
    w.add_uint32(f"{arch}.feed_forward_length", shape["n_ff"])
    return w


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def export(path, p, shape, fp, model_path, subset, matrix_type):
    w = head_writer(path, "eagle", fp, shape)
    for name, tensor in TENSOR_NAMES.items():
        x = np.asarray(p[name], dtype=np.float32)
        if name not in MATRICES:
            w.add_tensor(tensor, x)
        elif matrix_type == "q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(tensor, gguf.quants.quantize(x, q8), raw_dtype=q8)
        else:
            w.add_tensor(tensor, x.astype(np.float16))
    if subset is not None:
        # The target's own LM-head rows for the subset, bytes unchanged (its quant type).
        t = lm_head_tensor(gguf.GGUFReader(model_path))
        w.add_array("eagle.vocab.ids", [int(x) for x in subset])
        w.add_tensor("eagle.lm_head.weight", np.ascontiguousarray(t.data[subset]),
                     raw_dtype=t.tensor_type)
    finish(w)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", action="append", required=True, help="kiln-features output prefix")
    ap.add_argument("--out", required=True, help="checkpoint directory")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="samples per step")
    ap.add_argument("--max-rows", type=int, default=160, help="rows per sample (longer are cut)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--vocab", type=int, default=8192,
                    help="training cross-entropy over the V tokens most frequent in the training "
                         "samples (0: all); held-out accuracy always over the whole vocabulary")
    ap.add_argument("--noise", type=float, default=0.1, help="uniform feature noise, x feature RMS")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--export", help="write the head file from the checkpoint and exit")
    ap.add_argument("--eval-data", action="append", default=[],
                    help="at export, also the top-1 on these kiln-features outputs (every "
                         "sample; e.g. gen_data.py --source chat-eval: prompts training never saw)")
    ap.add_argument("--matrix-type", choices=["q8_0", "f16"], default="q8_0",
                    help="exported type of the head's matrices (q8_0: about half the bytes a "
                         "head pass reads)")
    args = ap.parse_args()

    shape, embd = target_shape(args.model)
    lm_head, fp = load_lm_head(args.model)
    embd, lm_head = jnp.asarray(embd), jnp.asarray(lm_head)
    samples = load_samples(args.data, args.max_rows)
    n_val = max(1, len(samples) // 10)
    train_idx = np.arange(len(samples) - n_val)
    val_idx = np.arange(len(samples) - n_val, len(samples))
    n_vocab = lm_head.shape[0]
    if args.vocab > 0:
        freq = np.bincount(np.concatenate([samples[i][0] for i in train_idx]), minlength=n_vocab)
        subset = np.sort(np.argsort(-freq, kind="stable")[:args.vocab])
    else:
        subset = np.arange(n_vocab)
    target_of = np.full(n_vocab, -1, np.int32)
    target_of[subset] = np.arange(subset.size, dtype=np.int32)
    lm_train, target_of = lm_head[jnp.asarray(subset)], jnp.asarray(target_of)
    loss_fn = make_loss(shape, args.noise)
    eval_fn = jax.jit(make_loss(shape, 0.0))
    os.makedirs(args.out, exist_ok=True)
    ck = os.path.join(args.out, "checkpoint.npz")
    if os.path.exists(ck):
        p, m, v, step, seconds, key = load_checkpoint(ck)
    else:
        key = jax.random.key(args.seed)
        key, init_key = jax.random.split(key)
        p = init_params(shape, init_key)
        m = jax.tree_util.tree_map(jnp.zeros_like, p)
        v = jax.tree_util.tree_map(jnp.zeros_like, p)
        step, seconds = 0, 0.0
    if args.export:
        acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd, lm_head)
        print(f"step {step}: held-out top-1 {acc:.4f} over {len(val_idx)} samples")
        draft_vocab = subset if args.vocab > 0 else None
        if draft_vocab is not None:
            acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd, lm_head,
                           draft_vocab)
            print(f"held-out top-1 drafting over the {draft_vocab.size} tokens: {acc:.4f}")
        if args.eval_data:
            eval_samples = load_samples(args.eval_data, args.max_rows)
            every = np.arange(len(eval_samples))
            acc = evaluate(eval_fn, p, eval_samples, every, args.batch, args.max_rows, embd,
                           lm_head, draft_vocab)
            print(f"--eval-data top-1 drafting as exported: {acc:.4f} over {len(every)} samples")
        export(args.export, p, shape, fp, args.model, draft_vocab, args.matrix_type)
        print(f"wrote {args.export}")
        return

    @jax.jit
    def train_step(p, m, v, step, tok, feat, length, key, embd, lm_train, target_of):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            p, tok, feat, length, key, embd, lm_train, target_of)
        warm = jnp.minimum(1.0, (step + 1) / 100.0)
        p, m, v, norm = adam_update(p, grads, m, v, step, args.lr * warm)
        return p, m, v, loss, aux, norm

    print(f"{len(samples)} samples ({len(train_idx)} train, {len(val_idx)} held out), "
          f"{sum(len(s[0]) for s in samples)} rows; step {step}, {seconds / 60:.1f} min so far",
          flush=True)
    rng = np.random.default_rng(args.seed + step)
    begin = time.time() - seconds
    while True:
        seconds = time.time() - begin
        if seconds >= args.minutes * 60 or (args.max_steps and step >= args.max_steps):
            break
        idx = rng.choice(train_idx, size=min(args.batch, len(train_idx)), replace=False)
        tok, feat, length = batch_arrays(samples, idx, args.max_rows)
        key, sub = jax.random.split(key)
        p, m, v, loss, (reg, ce, correct, n), norm = train_step(
            p, m, v, step, tok, feat, length, sub, embd, lm_train, target_of)
        step += 1
        if step % 10 == 0:
            print(f"step {step} {seconds / 60:.1f} min: loss {float(loss):.4f} reg {float(reg):.4f} "
                  f"ce {float(ce):.3f} top1 {float(correct) / float(n):.3f} |g| {float(norm):.2f}",
                  flush=True)
        if step % args.eval_every == 0:
            acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd, lm_head)
            print(f"step {step}: held-out top-1 {acc:.4f}", flush=True)
        if step % args.checkpoint_every == 0:
            save_checkpoint(ck, p, m, v, step, time.time() - begin, key)
    save_checkpoint(ck, p, m, v, step, time.time() - begin, key)
    acc = evaluate(eval_fn, p, samples, val_idx, args.batch, args.max_rows, embd, lm_head)
    print(f"done: step {step}, {(time.time() - begin) / 60:.1f} min, held-out top-1 {acc:.4f}")


if __name__ == "__main__":
    main()
