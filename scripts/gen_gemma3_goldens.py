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
      scripts/gen_qwen2_goldens.py). Raw prompts: tokenize(add_special=True, parse_special=False)
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
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_llama_goldens import (CHAT_PROMPTS, DEFAULT_TEXT, GOLDEN_DIR, KV_TYPES, N_THREADS,  # noqa: E402
                               RAW_PROMPTS, ROOT, SEED, llama_cpp, top2)
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402
import jinja2.ext  # noqa: E402

DEFAULT_MODEL = os.path.join(
    os.environ.get("KILN_MODEL_DIR", os.path.expanduser("~/.cache/kiln")),
    "gemma-3-270m-q4_k_m.gguf")
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


def render_chat(user_text):
    """Renders one user message like transformers' apply_chat_template."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    with open(TEMPLATE) as f:
        template = env.from_string(f.read())
    return template.render(messages=[{"role": "user", "content": user_text}],
                           add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")


def load(path, n_ctx, logits_all=False):
    return llama_cpp.Llama(model_path=path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                           n_ctx=n_ctx, n_batch=512, seed=SEED, logits_all=logits_all,
                           flash_attn=False, type_k=KV_TYPES["f16"], type_v=KV_TYPES["f16"],
                           verbose=False)


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)


def greedy(llm, prompt_ids, n_new):
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


def gen_greedy(model_path):
    llm = load(model_path, N_CTX)
    cases = []
    for templated, prompts in ((False, RAW_PROMPTS), (True, CHAT_PROMPTS)):
        for user_text in prompts:
            text = render_chat(user_text) if templated else user_text
            prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=not templated,
                                      special=templated)
            generated, top_ids, top_logits, stop = greedy(llm, prompt_ids, N_NEW)
            cases.append({
                "user_text": user_text,
                "templated": templated,
                "prompt": text,
                "prompt_ids": prompt_ids,
                "generated_ids": generated,
                "stopped_at_eog": stop,
                "top2_ids": top_ids,
                "top2_logits": top_logits,
                "text": llm.detokenize(generated, special=True).decode("utf-8", "replace"),
            })
            print(f"{'chat' if templated else 'raw '} {len(prompt_ids):3d}+{len(generated):2d} "
                  f"{cases[-1]['text'][:60]!r}", file=sys.stderr)
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
    llm = load(model_path, n_ctx, logits_all=True)
    with open(text_path, "rb") as f:
        text = f.read()
    tokens = llm.tokenize(text, add_bos=True, special=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll, count, running = 0.0, 0, []
    for i in range(n_chunk):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        targets = list(chunk)
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:n_ctx], dtype=np.float64)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            nll += m + math.log(np.exp(row - m).sum()) - row[targets[j + 1]]
            count += 1
        running.append(math.exp(nll / count))
        print(f"[{i + 1}] {running[-1]:.4f}", file=sys.stderr)
    return {
        "model": os.path.basename(model_path),
        "text": os.path.relpath(text_path, ROOT),
        "n_text_tokens": len(tokens),
        "n_ctx": n_ctx,
        "n_chunks": n_chunk,
        "n_scored": count,
        "add_bos": add_bos,
        "kv_type": "f16",
        "perplexity": math.exp(nll / count),
        "running_perplexity": running,
        "method": "llama-perplexity (scripts/gen_llama_goldens.py gen_perplexity)",
        "generator": f"scripts/gen_gemma3_goldens.py: llama-cpp-python {llama_cpp.__version__}, "
                     f"n_threads={N_THREADS}, n_batch=512, flash_attn off",
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--skip-greedy", action="store_true")
    parser.add_argument("--skip-perplexity", action="store_true")
    args = parser.parse_args()
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    if not args.skip_greedy:
        with open(os.path.join(GOLDEN_DIR, "gemma3_greedy.json"), "w") as f:
            json.dump(gen_greedy(args.model), f, indent=1)
            f.write("\n")
    if not args.skip_perplexity:
        ppl = gen_perplexity(args.model, args.text, PPL_CTX)
        with open(os.path.join(GOLDEN_DIR, "gemma3_perplexity.json"), "w") as f:
            json.dump(ppl, f, indent=1)
            f.write("\n")
        print(f"perplexity: {ppl['perplexity']:.4f} over {ppl['n_scored']} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
