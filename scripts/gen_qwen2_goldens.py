#!/usr/bin/env python3
"""Generates the llama.cpp goldens for kiln's qwen2 architecture (tests/unit/arch_golden_test.cc).

Writes tests/data/golden/qwen2_greedy.json from llama-cpp-python (an independent engine) on
random-weight qwen2 models that kiln-mkmodel writes (lib/model/random_model.h):

  shapes  tiny-qwen2 (tied output, like the small Qwen2 models) and tiny-qwen2-untied
          (its own output.weight), one fixed seed per shape;
  types   f32, f16 and q8_0 for each shape;
  KV      llama.cpp's KV cache in f32 and in f16 for each model.

For each model: the shape, type and seed it was made from, its size and FNV-1a 64 hash (so the
test can tell that the library regenerates the very file llama.cpp saw), and for each KV type and
raw prompt: llama.cpp's prompt token ids (add_special=True, parse_special off; the tiny
vocabulary has add_bos false), 32 greedily decoded token ids (argmax, ties to the lowest id;
stops early only at an end-of-generation token, recorded in "stopped_at_eog") and for every
generated position the top-2 logits (ids and values) llama.cpp chose from. The prompt is
evaluated in one batch, then one token per call, flash attention off, greedy as in
scripts/gen_llama_goldens.py, except that llama.cpp computes the logits of the last token of
each batch only (logits_all off, its default; read with llama_get_logits_ith): its last layer
then runs the feed-forward block for that token alone, which for f32 and f16 weights decides the
summation order of those matmuls.

With --cli-text it prints instead the text tests/c_api/kiln_cli_test.sh expects from
`kiln generate --raw --temp 0 --llama-cpp-order`: llama.cpp's greedy continuation (KV f16, the
default of both) of CLI_PROMPT on CLI_MODEL, CLI_TOKENS tokens.

Usage: python3 scripts/gen_qwen2_goldens.py [--mkmodel build/tools/kiln-mkmodel/kiln-mkmodel]
                                            [--cli-text]
       (needs kiln-mkmodel built, and pip install llama-cpp-python jinja2 numpy)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama_goldens import GOLDEN_DIR, KV_TYPES, N_THREADS, ROOT, SEED, llama_cpp, top2  # noqa: E402

N_NEW = 32
N_CTX = 512  # the shapes' context length

# (shape, seed): every type of a shape is made from the same seed, so its f32, f16 and q8_0
# files hold the same weights at three precisions.
MODELS = [("tiny-qwen2", 1), ("tiny-qwen2-untied", 2)]
TYPES = ["f32", "f16", "q8_0"]
KV_CACHE_TYPES = ["f32", "f16"]

# kiln_cli_test.sh: (shape, type, seed), prompt, tokens (an ASCII continuation).
CLI_MODEL = ("tiny-qwen2-untied", "f16", 1)
CLI_PROMPT = "The capital of France is"
CLI_TOKENS = 15

PROMPTS = [
    "The capital of France is",
    "Once upon a time there was a little girl who lived in a village near the forest.",
    "Count from one to ten: one, two, three,",
]


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def make_model(mkmodel, shape, type_name, seed, path):
    subprocess.run([mkmodel, "--shape", shape, "--type", type_name, "--seed", str(seed), "--out",
                    path], check=True, stdout=subprocess.DEVNULL)
    with open(path, "rb") as f:
        data = f.read()
    return len(data), f"{fnv1a64(data):016x}"


def load(path, kv_type):
    return llama_cpp.Llama(model_path=path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                           n_ctx=N_CTX, n_batch=512, seed=SEED, logits_all=False,
                           flash_attn=False, type_k=KV_TYPES[kv_type], type_v=KV_TYPES[kv_type],
                           verbose=False)


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)


def greedy(llm, prompt_ids, n_new):
    """gen_llama_goldens.greedy with the last batch token's logits only."""
    llm.reset()
    llm.eval(prompt_ids)
    generated, top_ids, top_logits = [], [], []
    stopped_at_eog = None
    for step in range(n_new):
        ids, vals = top2(last_logits(llm))
        token = ids[0]
        generated.append(token)
        top_ids.append(ids)
        top_logits.append(vals)
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            stopped_at_eog = step
            break
        llm.eval([token])
    return generated, top_ids, top_logits, stopped_at_eog


def gen_model(path, kv_type):
    llm = load(path, kv_type)
    cases = []
    for text in PROMPTS:
        prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        generated, top_ids, top_logits, stop = greedy(llm, prompt_ids, N_NEW)
        cases.append({
            "prompt": text,
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "stopped_at_eog": stop,
            "top2_ids": top_ids,
            "top2_logits": top_logits,
        })
    return {"kv_type": kv_type, "cases": cases}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mkmodel",
                        default=os.path.join(ROOT, "build", "tools", "kiln-mkmodel", "kiln-mkmodel"))
    parser.add_argument("--cli-text", action="store_true")
    args = parser.parse_args()
    if args.cli_text:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "cli.gguf")
            shape, type_name, seed = CLI_MODEL
            make_model(args.mkmodel, shape, type_name, seed, path)
            llm = load(path, "f16")
            ids = llm.tokenize(CLI_PROMPT.encode("utf-8"), add_bos=True, special=False)
            generated, _, _, _ = greedy(llm, ids, CLI_TOKENS)
            print(llm.detokenize(generated).decode("utf-8"))
        return
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, seed in MODELS:
            for type_name in TYPES:
                path = os.path.join(tmp, f"{shape}-{type_name}.gguf")
                size, digest = make_model(args.mkmodel, shape, type_name, seed, path)
                runs = [gen_model(path, kv_type) for kv_type in KV_CACHE_TYPES]
                models.append({"shape": shape, "type": type_name, "seed": seed,
                               "file_bytes": size, "file_fnv1a64": digest, "runs": runs})
                firsts = [len(c["generated_ids"]) for r in runs for c in r["cases"]]
                print(f"{shape} {type_name}: {size} bytes, fnv1a64 {digest}, generated {firsts}",
                      file=sys.stderr)
    out = {
        "generator": f"scripts/gen_qwen2_goldens.py: llama-cpp-python {llama_cpp.__version__}, "
                     f"n_threads={N_THREADS}, n_ctx={N_CTX}, n_batch=512, seed={SEED}, logits_all "
                     f"off, flash_attn off, greedy argmax (ties: lowest id)",
        "family": "qwen2",
        "n_new": N_NEW,
        "models": models,
    }
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    with open(os.path.join(GOLDEN_DIR, "qwen2_greedy.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
