#!/usr/bin/env python3
"""Generates the llama.cpp goldens that tests/unit/e2e_gemma3_test.cc compares kiln against.

From llama-cpp-python (an independent engine) on Gemma 3 270M Q4_K_M (scripts/fetch_gemma3.sh):

  tests/data/golden/gemma3_greedy.json
      For each of 14 prompts (7 raw, 7 chat; the default model's prompts of
      scripts/gen_llama_goldens.py): its text, whether it was chat-templated, llama.cpp's prompt
      token ids, N_NEW greedily decoded ids (argmax, ties to the lowest id; stops early only at an
      end-of-generation token, "stopped_at_eog") and for every generated position the top-2
      logits (ids and values) llama.cpp chose from. The prompt is evaluated in one batch, then
      one token per call, flash attention off, KV cache f16 (llama.cpp's default), logits of the
      last token of each batch only (logits_all off, read with llama_get_logits_ith, as
      scripts/gen_arch_goldens.py). Raw prompts: tokenize(add_special=True, parse_special=False)
      (Gemma's vocab adds BOS). Chat prompts: the file has no tokenizer.chat_template, so they are
      rendered from Gemma 3's own Hugging Face template (tests/data/chat/templates/gemma3.jinja)
      with jinja2 as transformers' apply_chat_template does (bos_token "<bos>", which the
      template writes), then tokenize(add_special=False, parse_special=True).
      "tokenizer": llama.cpp's ids of TOKENIZER_CASES, without and with special-token parsing
      (add_special False), for kiln's tokenizer.

  tests/data/golden/gemma3_perplexity.json
      llama-perplexity's method as scripts/gen_llama_goldens.py's gen_perplexity (add_bos: each
      chunk's first token becomes BOS), n_ctx PPL_CTX (so the second half of each chunk, the
      scored one, runs past the 512-token sliding window), KV f16.

Usage: python3 scripts/gen_gemma3_goldens.py [--model PATH] [--text PATH] [--skip-perplexity]
       (needs pip install llama-cpp-python jinja2 numpy, and the model: scripts/fetch_gemma3.sh)
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama_goldens import CHAT_PROMPTS, RAW_PROMPTS  # noqa: E402
from llama_goldens import (DEFAULT_TEXT, MODEL_DIR, N_THREADS, ROOT, SEED,  # noqa: E402
                           chat_cases, llama_cpp, load, perplexity, render_chat, write_golden)

DEFAULT_MODEL = os.path.join(MODEL_DIR, "gemma-3-270m-q4_k_m.gguf")
TEMPLATE = os.path.join(ROOT, "tests", "data", "chat", "templates", "gemma3.jinja")

N_NEW = 32
N_CTX = 2048
PPL_CTX = 1024

TOKENIZER_CASES = [
    "Hello world! This is a simple English sentence.",
    "",
    " ",
    " leading space",
    "trailing spaces   ",
    "a     b",
    "    \t\t  \n  ",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nendings\r\n",
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))\n",
    "{\"key\": [1, 2.5, -3e10], \"nested\": {\"x\": null}}",
    "3141592653589793238462643383279502884197169399375105820974944",
    "v1.2.3 costs $1,234.56 (or 99%) at 10:45pm on 2024-01-31",
    "Wait... what?! (Really) -- \"yes\"; [ok] {fine} <tag> @home #1 & ~x^y|z",
    "Grüße aus München! Ça va? Ñandú. Ελληνικά. Русский текст.",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "emoji: 😀🎉👍🏽 family: 👨‍👩‍👧‍👦 flags: 🇫🇷🇯🇵",
    "मराठी हिन्दी العربية עברית ไทย",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos<eos> and <pad> and <unk>",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "a" * 300,
]


def gen_greedy(model_path):
    llm = load(model_path, N_CTX)
    with open(TEMPLATE) as f:
        template = f.read()
    # The template writes <bos> itself: chat prompts are tokenized without add_special.
    cases = chat_cases(llm, RAW_PROMPTS, CHAT_PROMPTS,
                       lambda text: render_chat(template, text, "<bos>", "<eos>"), N_NEW,
                       bos_on_chat=False)
    tokenizer = []
    for text in TOKENIZER_CASES:
        raw = text.encode("utf-8")
        tokenizer.append({"text": text,
                          "ids": llm.tokenize(raw, add_bos=False, special=False),
                          "ids_special": llm.tokenize(raw, add_bos=False, special=True)})
    return {
        "model": os.path.basename(model_path),
        "generator": f"scripts/gen_gemma3_goldens.py: llama-cpp-python {llama_cpp.__version__}, "
                     f"n_threads={N_THREADS}, n_ctx={N_CTX}, n_batch=512, seed={SEED}, KV f16, "
                     f"logits_all off, flash_attn off, greedy argmax (ties: lowest id)",
        "kv_type": "f16",
        "n_new": N_NEW,
        "cases": cases,
        "tokenizer": tokenizer,
    }


def gen_perplexity(model_path, text_path, n_ctx):
    return perplexity(
        model_path, text_path, n_ctx,
        method="llama-perplexity (scripts/gen_llama_goldens.py gen_perplexity)",
        generator=f"scripts/gen_gemma3_goldens.py: llama-cpp-python {llama_cpp.__version__}, "
                  f"n_threads={N_THREADS}, n_batch=512, flash_attn off")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--skip-greedy", action="store_true")
    parser.add_argument("--skip-perplexity", action="store_true")
    args = parser.parse_args()
    if not args.skip_greedy:
        write_golden("gemma3_greedy.json", gen_greedy(args.model))
    if not args.skip_perplexity:
        ppl = gen_perplexity(args.model, args.text, PPL_CTX)
        write_golden("gemma3_perplexity.json", ppl)
        print(f"perplexity: {ppl['perplexity']:.4f} over {ppl['n_scored']} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
