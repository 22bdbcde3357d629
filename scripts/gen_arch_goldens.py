#!/usr/bin/env python3
"""Generates the llama.cpp goldens for kiln's architectures beyond llama, qwen2 and gemma3
(tests/unit/arch_golden_test.cc).

Writes tests/data/golden/<family>_greedy.json for each family below from llama-cpp-python (an
independent engine) on the random-weight model kiln-mkmodel writes for its shape
(lib/model/random_model.h):

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
  deepseek2_yarn  tiny-deepseek2-yarn  YaRN factor 40 from an original context of 64, with
                                       yarn_log_multiplier 0.0707 (the attention scale's mscale)

Each at f32, f16 and q8_0 (deepseek2_moe: f32 and f16 only, see TYPES_BY_FAMILY; one seed per
family, so the files hold the same weights at each precision), each with llama.cpp's KV cache in f32 and in f16. The record per model and the
decoding are those of scripts/gen_qwen2_goldens.py: file size and FNV-1a 64 hash, and per KV
type and raw prompt llama.cpp's prompt ids (add_special=True, parse_special off), N_NEW greedy
tokens and the top-2 logits at each step; the prompt in one batch, then one token per call, the
last batch token's logits only, flash attention off.

Usage: python3 scripts/gen_arch_goldens.py [--mkmodel build/tools/kiln-mkmodel/kiln-mkmodel]
                                           [--family qwen3 ...]
       (needs kiln-mkmodel built, and pip install llama-cpp-python==0.3.36 numpy)
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama_goldens import GOLDEN_DIR, N_THREADS, ROOT, SEED, llama_cpp  # noqa: E402
from gen_qwen2_goldens import N_CTX, gen_model, make_model  # noqa: E402
import gen_qwen2_goldens  # noqa: E402

N_NEW = 24
# family -> (shape, seed)
FAMILIES = {
    "qwen3": ("tiny-qwen3", 3),
    "llama3": ("tiny-llama3", 4),
    "phi3": ("tiny-phi", 5),
    "mistral3": ("tiny-mistral3", 6),
    "deepseek2": ("tiny-deepseek2", 7),
    "deepseek2_lite": ("tiny-deepseek2-lite", 8),
    "deepseek2_kvb": ("tiny-deepseek2-kvb", 9),
    "deepseek2_moe": ("tiny-deepseek2-moe", 10),
    "deepseek2_yarn": ("tiny-deepseek2-yarn", 11),
}
TYPES = ["f32", "f16", "q8_0"]
# Mixture-of-experts routing is discontinuous: q8_0's activation rounding (~1e-2) moves router
# scores across near-ties (top-2 margins of 6e-4 occur), and one flipped expert changes the
# logits by 0.3-1.4 (seeds 10, 13, 14), far past any rounding bound; f32 and f16 stay within
# 6e-3. So the MoE goldens are f32 and f16 only (kiln's q8_0 experts: moe_ffn_test).
TYPES_BY_FAMILY = {"deepseek2_moe": ["f32", "f16"]}
KV_CACHE_TYPES = ["f32", "f16"]

# Digit runs, contractions, punctuation and repeated spaces: where the llama-bpe pre-tokenizer
# splits differently from the default one.
PROMPTS = [
    "The capital of France is",
    "Numbers like 2024 and 1234567 don't split the same way; it's 3.14159!",
    "Once upon a time there was a little girl   who lived\n\nin a village near the forest.",
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mkmodel",
                        default=os.path.join(ROOT, "build", "tools", "kiln-mkmodel", "kiln-mkmodel"))
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    args = parser.parse_args()
    # gen_qwen2_goldens.gen_model decodes its module's PROMPTS, N_NEW tokens each.
    gen_qwen2_goldens.PROMPTS = PROMPTS
    gen_qwen2_goldens.N_NEW = N_NEW
    for family in args.family or list(FAMILIES):
        shape, seed = FAMILIES[family]
        models = []
        with tempfile.TemporaryDirectory() as tmp:
            for type_name in TYPES_BY_FAMILY.get(family, TYPES):
                path = os.path.join(tmp, f"{shape}-{type_name}.gguf")
                size, digest = make_model(args.mkmodel, shape, type_name, seed, path)
                runs = [gen_model(path, kv_type) for kv_type in KV_CACHE_TYPES]
                models.append({"shape": shape, "type": type_name, "seed": seed,
                               "file_bytes": size, "file_fnv1a64": digest, "runs": runs})
                lens = [len(c["generated_ids"]) for r in runs for c in r["cases"]]
                print(f"{family} {shape} {type_name}: {size} bytes, fnv1a64 {digest}, "
                      f"generated {lens}", file=sys.stderr)
        out = {
            "generator": f"scripts/gen_arch_goldens.py: llama-cpp-python {llama_cpp.__version__}, "
                         f"n_threads={N_THREADS}, n_ctx={N_CTX}, n_batch=512, seed={SEED}, "
                         f"logits_all off, flash_attn off, greedy argmax (ties: lowest id)",
            "family": family,
            "n_new": N_NEW,
            "models": models,
        }
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(os.path.join(GOLDEN_DIR, f"{family}_greedy.json"), "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
