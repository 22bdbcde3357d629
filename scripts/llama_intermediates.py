#!/usr/bin/env python3
"""Dumps llama.cpp's intermediate tensors (via llama-cpp-python's graph callback) to .npz files.

The tool that checks kiln's CPU numerics against ggml's op by op (docs/numerics.md): run a
prompt through llama.cpp, save e.g. layer 0's attn_norm, Qcur, kq, kq_soft_max, kqv, ffn_out,
l_out, and compare them with kiln's values for the same inputs. Only names of fused-op outputs
should be requested (asking for "norm-N" splits the rms_norm + mul fusion).

Usage: python3 scripts/llama_intermediates.py [--model PATH] [--kv f16|f32] [--layers 0,1]
           [--out DIR] ID,ID,... [ID,...]
Each argument is one llama_decode call of comma-separated token ids (the first is the prompt
batch, later ones e.g. single decode steps); call i is written to DIR/step<i>.npz.
Needs llama-cpp-python and numpy (not needed by the test suite).
"""

import argparse
import ctypes
import os
import sys

import numpy as np

try:
    import llama_cpp as L
except ImportError as e:  # pragma: no cover
    sys.exit(f"missing dependency: {e} (pip install llama-cpp-python)")

DEFAULT_MODEL = os.path.join(
    os.environ.get("KILN_MODEL_DIR", os.path.expanduser("~/.cache/kiln")),
    "SmolLM2-135M-Instruct.Q4_1.gguf")


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of the ggml vendored by llama-cpp-python 0.3.x."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


EVAL_CB = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--kv", choices=("f16", "f32"), default="f32")
    ap.add_argument("--layers", default="0")
    ap.add_argument("--out", default="/tmp/llama_intermediates")
    ap.add_argument("batches", nargs="+", help="comma-separated token ids, one argument per call")
    args = ap.parse_args()
    groups = [[int(t) for t in b.split(",")] for b in args.batches]
    suffixes = tuple(f"-{l}" for l in args.layers.split(","))
    store = {}

    @EVAL_CB
    def callback(ptr, ask, _):
        t = GgmlTensor.from_address(ptr)
        name = t.name.decode()
        if ask:
            return name.endswith(suffixes) and not name.startswith("norm-")
        if t.type not in (0, 1):  # f32, f16
            return True
        size = 4 if t.type == 0 else 2
        ne, nb = list(t.ne), list(t.nb)
        span = sum((ne[i] - 1) * nb[i] for i in range(4)) + size
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * span).from_address(t.data)).copy()
        view = np.lib.stride_tricks.as_strided(raw, shape=(ne[3], ne[2], ne[1], ne[0], size),
                                               strides=(nb[3], nb[2], nb[1], nb[0], 1))
        arr = np.ascontiguousarray(view).view(np.float32 if t.type == 0 else np.float16)
        key, k = name, 1
        while key in store:  # views of one name (e.g. Qcur-0 before and after RoPE)
            key, k = f"{name}#{k}", k + 1
        store[key] = arr.reshape(ne[3], ne[2], ne[1], ne[0])
        return True

    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048, 512, 512
    cp.flash_attn_type = 0  # llama.cpp's classic attention (what the goldens use)
    if args.kv == "f32":
        cp.type_k = cp.type_v = 0
    cp.cb_eval = callback
    ctx = L.llama_init_from_model(model, cp)
    os.makedirs(args.out, exist_ok=True)
    pos = 0
    for i, toks in enumerate(groups):
        store.clear()
        batch = L.llama_batch_init(len(toks), 0, 1)
        batch.n_tokens = len(toks)
        for j, tok in enumerate(toks):
            batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, pos + j, 1
            batch.seq_id[j][0], batch.logits[j] = 0, 1
        if L.llama_decode(ctx, batch) != 0:
            sys.exit("llama_decode failed")
        L.llama_batch_free(batch)
        pos += len(toks)
        path = os.path.join(args.out, f"step{i}.npz")
        np.savez(path, **store)
        print(f"{path}: {', '.join(sorted(store))}")


if __name__ == "__main__":
    main()
