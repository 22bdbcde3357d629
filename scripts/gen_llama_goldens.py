#!/usr/bin/env python3
"""Generates the llama.cpp goldens that tests/unit/e2e_smollm2_test.cc compares kiln against.

Writes, from llama-cpp-python (an independent engine) on the default model
(SmolLM2-135M-Instruct Q4_1):

  tests/data/golden/smollm2_greedy.json
      For each prompt: its text, whether it was chat-templated, llama.cpp's prompt token ids,
      64 greedily decoded token ids (argmax, ties to the lowest id; stops early only at an
      end-of-generation token, recorded in "stopped_at_eog"), and for every generated position
      the top-2 logits (ids and values) llama.cpp saw when choosing that token.
      Raw prompts are tokenized as is (parse_special off); templated prompts are rendered from
      the model's own chat template with jinja2 exactly like Hugging Face's apply_chat_template
      (sandboxed environment, trim_blocks, lstrip_blocks, add_generation_prompt) and tokenized
      with parse_special on. Both use add_special=True, which follows the vocab's add_bos flag
      (false for SmolLM2, so no BOS is prepended).

  tests/data/golden/smollm2_greedy_kv_f32.json
      The same with llama.cpp's KV cache in f32. With its default f16 cache (flash attention off)
      llama.cpp rounds Q to f16 for K.Q and the softmax weights to f16 for V.P; with an f32 cache
      attention stays in f32, which is the like-for-like comparison for an engine that does not
      round there. On this small model that choice alone moves llama.cpp's own logits by up to
      ~3.6 and flips 11 of 294 argmaxes, so both goldens are kept.

  tests/data/golden/smollm2_perplexity.json
      llama-perplexity's method (examples/perplexity/perplexity.cpp, perplexity()) replicated
      with llama.cpp's own eval and logits: the text is tokenized with add_special=True and
      parse_special off; it is cut into floor(n_tokens / n_ctx) chunks of n_ctx tokens; each
      chunk is evaluated from an empty KV cache (its first token replaced by BOS if the vocab's
      add_bos is set; not for SmolLM2); for j in [n_ctx/2, n_ctx - 1) the negative log of
      softmax(logits[j])[token j+1] is summed in float64; perplexity = exp(sum / count). KV
      cache f16 (llama-perplexity's default); "running_perplexity" holds the value after each
      chunk, as llama-perplexity prints it.

  tests/data/golden/smollm2_f32_logits.json   (with --f32-model PATH, after the above)
      llama.cpp's top-5 logits at every position of a few prompts on an all-f32 copy of the
      model written by kiln-quantize, KV f32: the forward pass without quantized arithmetic.

Usage: python3 scripts/gen_llama_goldens.py [--model PATH] [--text PATH] [--ctx 512]
       build/tools/kiln-quantize/kiln-quantize MODEL /tmp/smollm2-f32.gguf --type f32 &&
         python3 scripts/gen_llama_goldens.py --f32-model /tmp/smollm2-f32.gguf
       python3 scripts/gen_llama_goldens.py --check-load PATH   (loads a GGUF in llama.cpp and
                                                                   greedily generates from it)
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_goldens import (DEFAULT_TEXT, GOLDEN_DIR, MODEL_DIR, N_THREADS, SEED,  # noqa: E402
                           chat_cases, greedy, llama_cpp, load, perplexity, render_chat,
                           write_golden)

DEFAULT_MODEL = os.path.join(MODEL_DIR, "SmolLM2-135M-Instruct.Q4_1.gguf")

N_CTX = 2048
N_NEW = 64

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a list of fruits:\n1. Apple\n2.",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 5, 8, 13,",
    "The theory of relativity, proposed by Albert Einstein,",
    "#include <stdio.h>\n\nint main(void) {\n",
]

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for staying focused while studying.",
    "Translate 'good morning' into Spanish and German.",
    "What is 12 times 7?",
    "Write a Python function that reverses a string.",
]


def gen_greedy(model_path, kv_type):
    # logits_all on: every prompt position's logits computed, as when this golden was first made.
    llm = load(model_path, N_CTX, kv_type, logits_all=True)
    template = llm.metadata["tokenizer.chat_template"]
    cases = chat_cases(llm, RAW_PROMPTS, CHAT_PROMPTS,
                       lambda text: render_chat(template, text, "<|im_start|>", "<|im_end|>"),
                       N_NEW, bos_on_chat=True)
    return {
        "model": os.path.basename(model_path),
        "generator": f"llama-cpp-python {llama_cpp.__version__}, n_threads={N_THREADS}, "
                     f"n_ctx={N_CTX}, seed={SEED}, flash_attn off, greedy argmax (ties: lowest id)",
        "kv_type": kv_type,
        "n_new": N_NEW,
        "cases": cases,
    }


def gen_perplexity(model_path, text_path, n_ctx):
    return perplexity(
        model_path, text_path, n_ctx,
        method="llama-perplexity: tokenize(text, add_special=True, parse_special=False); "
               "chunks of n_ctx tokens, each from an empty cache, first token replaced by "
               "BOS when add_bos; NLL of token j+1 from logits[j] for j in [n_ctx/2, "
               "n_ctx-1), summed in float64; exp(mean)",
        generator=f"llama-cpp-python {llama_cpp.__version__}, n_threads={N_THREADS}")


def gen_f32_logits(f32_model_path, kv_f32_golden):
    """llama.cpp's logits on an all-f32 copy of the model (kiln-quantize --type f32), f32 KV.

    Without quantized activations or f16 rounding anywhere, kiln and llama.cpp compute the same
    graph in f32: this isolates the forward pass itself from the arithmetic of quantized dots.
    """
    llm = load(f32_model_path, 512, "f32", logits_all=True)
    cases = []
    for c in kv_f32_golden["cases"][::3]:
        ids = c["prompt_ids"] + c["generated_ids"][:16]
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
        top = [np.argsort(-row, kind="stable")[:5] for row in logits]
        cases.append({"user_text": c["user_text"], "ids": ids,
                      "top5_ids": [[int(i) for i in t] for t in top],
                      "top5_logits": [[float(row[i]) for i in t] for row, t in zip(logits, top)]})
    return {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf requantized to f32 by kiln-quantize",
        "generator": f"llama-cpp-python {llama_cpp.__version__}, n_threads={N_THREADS}, "
                     f"flash_attn off, KV f32; logits at every position of prompt + the first 16 "
                     f"generated ids of smollm2_greedy_kv_f32.json (every third case)",
        "cases": cases,
    }


def check_load(path):
    llm = load(path, 512, logits_all=True)
    ids = llm.tokenize(b"The capital of France is", add_bos=True, special=False)
    generated, _, _, _ = greedy(llm, ids, 16)
    text = llm.detokenize(generated).decode("utf-8", "replace")
    print(f"llama.cpp loaded {path} and generated: {text!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--check-load", metavar="GGUF")
    parser.add_argument("--skip-perplexity", action="store_true")
    parser.add_argument("--f32-model", metavar="GGUF",
                        help="only write smollm2_f32_logits.json from this f32 copy (kiln-quantize "
                             "IN OUT --type f32)")
    args = parser.parse_args()
    if args.check_load:
        check_load(args.check_load)
        return
    if args.f32_model:
        with open(os.path.join(GOLDEN_DIR, "smollm2_greedy_kv_f32.json")) as f:
            write_golden("smollm2_f32_logits.json", gen_f32_logits(args.f32_model, json.load(f)))
        return
    for kv_type, name in (("f16", "smollm2_greedy.json"), ("f32", "smollm2_greedy_kv_f32.json")):
        write_golden(name, gen_greedy(args.model, kv_type))
    if not args.skip_perplexity:
        ppl = gen_perplexity(args.model, args.text, args.ctx)
        write_golden("smollm2_perplexity.json", ppl)
        print(f"perplexity: {ppl['perplexity']:.4f} over {ppl['n_scored']} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
