#!/usr/bin/env python3
"""Generates the llama.cpp goldens for kiln's architectures on tiny random-weight models
(tests/unit/arch_golden_test.cc, tests/unit/deepseek2_forward_test.cc).

Writes tests/data/golden/<family>_greedy.json for each family below from llama-cpp-python (an
independent engine) on the random-weight models kiln-mkmodel writes for its shapes
(lib/model/random_model.h):

  qwen2     tiny-qwen2     "qwen2": Q/K/V biases, NEOX RoPE, tied output (like the small Qwen2
                           models); tiny-qwen2-untied: its own output.weight
  qwen3     tiny-qwen3     general.architecture "qwen3": Q/K norms, NEOX RoPE, head_dim 128
  llama3    tiny-llama3    "llama" with Llama 3.1's RoPE scaling (rope_freqs.weight) and the
                           "llama-bpe" pre-tokenizer (BOS added)
  phi3      tiny-phi       "phi3": fused attn_qkv and gate+up, an ignored sliding window
  mistral3  tiny-mistral3  "mistral3": head_dim 128, attention temperature scaling past
                           position 8
  deepseek2       tiny-deepseek2       "deepseek2": MLA with q-LoRA and attn_k_b/attn_v_b
                                       (llama.cpp runs it absorbed, as MQA over the latent)
  deepseek2_lite  tiny-deepseek2-lite  the same without q-LoRA (attn_q)
  deepseek2_kvb   tiny-deepseek2-kvb   the older combined attn_kv_b (llama.cpp decompresses)
  deepseek2_moe   tiny-deepseek2-moe   1 dense + 2 mixture-of-experts layers: 8 experts in 4
                                       groups (2 used), top-2, 1 shared expert, sigmoid gating
                                       with exp_probs_b, normalized weights scaled by 2.5
  deepseek2_moe_softmax  tiny-deepseek2-moe-softmax  the same layers with softmax gating
                                       (ggml_soft_max), top-3 of 8 experts, 2 shared, no
                                       groups, no bias, weights neither normalized nor scaled
  deepseek2_yarn  tiny-deepseek2-yarn  YaRN factor 40 from an original context of 64, with
                                       yarn_log_multiplier 0.0707 (the attention scale's mscale)

Each at f32, f16 and q8_0, one seed per shape, so a shape's files hold the same weights at each
precision, each with llama.cpp's KV cache in f32 and in f16. For each model: the shape, type and seed it was made from, its size and FNV-1a
64 hash (so the test can tell that the library regenerates the very file llama.cpp saw), and for
each KV type and raw prompt: llama.cpp's prompt token ids (add_special=True, parse_special off),
the family's n_new greedily decoded ids (argmax, ties to the lowest id; stops early only at an
end-of-generation token, recorded in "stopped_at_eog") and for every generated position the top-2
logits (ids and values) llama.cpp chose from. The prompt is evaluated in one batch, then one token
per call, flash attention off, the last batch token's logits only (logits_all off, llama.cpp's
default: its last layer then runs the feed-forward block for that token alone, which for f32 and
f16 weights decides the summation order of those matmuls).

With --cli-text it prints instead the text tests/c_api/kiln_cli_test.sh expects from
`kiln generate --raw --temp 0 --llama-cpp-order`: llama.cpp's greedy continuation (KV f16, the
default of both) of CLI_PROMPT on CLI_MODEL, CLI_TOKENS tokens.

Usage: python3 scripts/gen_arch_goldens.py [--mkmodel build/tools/kiln-mkmodel/kiln-mkmodel]
                                           [--family qwen3 ...] [--cli-text]
       (needs kiln-mkmodel built, and pip install llama-cpp-python==0.3.36 jinja2 numpy)
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_goldens import (MKMODEL, N_THREADS, SEED, greedy, greedy_case, llama_cpp,  # noqa: E402
                           load, make_model, write_golden)

N_CTX = 512  # the shapes' context length

# Digit runs, contractions, punctuation and repeated spaces: where the llama-bpe pre-tokenizer
# splits differently from the default one.
PROMPTS = [
    "The capital of France is",
    "Numbers like 2024 and 1234567 don't split the same way; it's 3.14159!",
    "Once upon a time there was a little girl   who lived\n\nin a village near the forest.",
]
QWEN2_PROMPTS = [
    "The capital of France is",
    "Once upon a time there was a little girl who lived in a village near the forest.",
    "Count from one to ten: one, two, three,",
]

# family -> ([(shape, seed)], prompts, greedy tokens per prompt)
FAMILIES = {
    "qwen2": ([("tiny-qwen2", 1), ("tiny-qwen2-untied", 2)], QWEN2_PROMPTS, 32),
    "qwen3": ([("tiny-qwen3", 3)], PROMPTS, 24),
    "llama3": ([("tiny-llama3", 4)], PROMPTS, 24),
    "phi3": ([("tiny-phi", 5)], PROMPTS, 24),
    "mistral3": ([("tiny-mistral3", 6)], PROMPTS, 24),
    "deepseek2": ([("tiny-deepseek2", 7)], PROMPTS, 24),
    "deepseek2_lite": ([("tiny-deepseek2-lite", 8)], PROMPTS, 24),
    "deepseek2_kvb": ([("tiny-deepseek2-kvb", 9)], PROMPTS, 24),
    "deepseek2_moe": ([("tiny-deepseek2-moe", 10)], PROMPTS, 24),
    "deepseek2_moe_softmax": ([("tiny-deepseek2-moe-softmax", 13)], PROMPTS, 24),
    "deepseek2_yarn": ([("tiny-deepseek2-yarn", 11)], PROMPTS, 24),
}
TYPES = ["f32", "f16", "q8_0"]
KV_CACHE_TYPES = ["f32", "f16"]

# kiln_cli_test.sh: (shape, type, seed), prompt, tokens (an ASCII continuation).
CLI_MODEL = ("tiny-qwen2-untied", "f16", 1)
CLI_PROMPT = "The capital of France is"
CLI_TOKENS = 15


def gen_model(path, kv_type, prompts, n_new):
    llm = load(path, N_CTX, kv_type)
    cases = []
    for text in prompts:
        prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        cases.append({"prompt": text, **greedy_case(llm, prompt_ids, n_new)})
    return {"kv_type": kv_type, "cases": cases}


def gen_family(mkmodel, family):
    shapes, prompts, n_new = FAMILIES[family]
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape, seed in shapes:
            for type_name in TYPES:
                path = os.path.join(tmp, f"{shape}-{type_name}.gguf")
                size, digest = make_model(mkmodel, shape, type_name, seed, path)
                runs = [gen_model(path, kv_type, prompts, n_new) for kv_type in KV_CACHE_TYPES]
                models.append({"shape": shape, "type": type_name, "seed": seed,
                               "file_bytes": size, "file_fnv1a64": digest, "runs": runs})
                lens = [len(c["generated_ids"]) for r in runs for c in r["cases"]]
                print(f"{family} {shape} {type_name}: {size} bytes, fnv1a64 {digest}, "
                      f"generated {lens}", file=sys.stderr)
    return {
        "generator": f"scripts/gen_arch_goldens.py: llama-cpp-python {llama_cpp.__version__}, "
                     f"n_threads={N_THREADS}, n_ctx={N_CTX}, n_batch=512, seed={SEED}, "
                     f"logits_all off, flash_attn off, greedy argmax (ties: lowest id)",
        "family": family,
        "n_new": n_new,
        "models": models,
    }


def cli_text(mkmodel):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cli.gguf")
        shape, type_name, seed = CLI_MODEL
        make_model(mkmodel, shape, type_name, seed, path)
        llm = load(path, N_CTX)
        ids = llm.tokenize(CLI_PROMPT.encode("utf-8"), add_bos=True, special=False)
        generated, _, _, _ = greedy(llm, ids, CLI_TOKENS)
        return llm.detokenize(generated).decode("utf-8")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mkmodel", default=MKMODEL)
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--cli-text", action="store_true")
    args = parser.parse_args()
    if args.cli_text:
        print(cli_text(args.mkmodel))
        return
    for family in args.family or list(FAMILIES):
        write_golden(f"{family}_greedy.json", gen_family(args.mkmodel, family))


if __name__ == "__main__":
    main()
