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
import math
import os
import sys

import numpy as np

try:
    import llama_cpp
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    import jinja2.ext
except ImportError as e:  # pragma: no cover
    sys.exit(f"missing dependency: {e} (pip install llama-cpp-python jinja2)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(ROOT, "tests", "data", "golden")
DEFAULT_MODEL = os.path.join(
    os.environ.get("KILN_MODEL_DIR", os.path.expanduser("~/.cache/kiln")),
    "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_TEXT = os.path.join(ROOT, "tests", "data", "text", "gpl-3.0.txt")

N_THREADS = 2
N_CTX = 2048
SEED = 1234
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


def render_chat(template_source, user_text):
    """Renders one user message like transformers' apply_chat_template."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(template_source)
    return template.render(messages=[{"role": "user", "content": user_text}],
                           add_generation_prompt=True, bos_token="<|im_start|>",
                           eos_token="<|im_end|>")


# KV cache types: llama.cpp's default is f16; "f32" keeps attention entirely in f32.
KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}


def load(model_path, n_ctx, kv_type="f16"):
    # flash_attn off: llama.cpp's classic attention path (KQ and KQV as matmuls).
    return llama_cpp.Llama(model_path=model_path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                           n_ctx=n_ctx, n_batch=512, seed=SEED, logits_all=True,
                           flash_attn=False, type_k=KV_TYPES[kv_type], type_v=KV_TYPES[kv_type],
                           verbose=False)


def top2(row):
    # Ties go to the lowest id: a stable sort on -logit keeps id order among equals.
    order = np.argsort(-row, kind="stable")[:2]
    return [int(order[0]), int(order[1])], [float(row[order[0]]), float(row[order[1]])]


def greedy(llm, prompt_ids, n_new):
    llm.reset()
    llm.eval(prompt_ids)
    generated, top_ids, top_logits = [], [], []
    stopped_at_eog = None
    for step in range(n_new):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        ids, vals = top2(row)
        token = ids[0]
        generated.append(token)
        top_ids.append(ids)
        top_logits.append(vals)
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
            stopped_at_eog = step
            break
        llm.eval([token])
    return generated, top_ids, top_logits, stopped_at_eog


def gen_greedy(model_path, kv_type):
    llm = load(model_path, N_CTX, kv_type)
    template = llm.metadata["tokenizer.chat_template"]
    cases = []
    for templated, prompts in ((False, RAW_PROMPTS), (True, CHAT_PROMPTS)):
        for user_text in prompts:
            text = render_chat(template, user_text) if templated else user_text
            prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=templated)
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
    return {
        "model": os.path.basename(model_path),
        "generator": f"llama-cpp-python {llama_cpp.__version__}, n_threads={N_THREADS}, "
                     f"n_ctx={N_CTX}, seed={SEED}, flash_attn off, greedy argmax (ties: lowest id)",
        "kv_type": kv_type,
        "n_new": N_NEW,
        "cases": cases,
    }


def gen_perplexity(model_path, text_path, n_ctx):
    llm = load(model_path, n_ctx)
    with open(text_path, "rb") as f:
        text = f.read()
    tokens = llm.tokenize(text, add_bos=True, special=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    if n_chunk < 2:
        sys.exit(f"{text_path}: only {len(tokens)} tokens, need at least {2 * n_ctx}")
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
            log_sum = m + math.log(np.exp(row - m).sum())
            nll += log_sum - row[targets[j + 1]]
            count += 1
        running.append(math.exp(nll / count))
        print(f"[{i + 1}] {running[-1]:.4f}", file=sys.stderr)
    ppl = math.exp(nll / count)
    return {
        "model": os.path.basename(model_path),
        "text": os.path.relpath(text_path, ROOT),
        "n_text_tokens": len(tokens),
        "n_ctx": n_ctx,
        "n_chunks": n_chunk,
        "n_scored": count,
        "add_bos": add_bos,
        "kv_type": "f16",
        "perplexity": ppl,
        "running_perplexity": running,
        "method": "llama-perplexity: tokenize(text, add_special=True, parse_special=False); "
                  "chunks of n_ctx tokens, each from an empty cache, first token replaced by "
                  "BOS when add_bos; NLL of token j+1 from logits[j] for j in [n_ctx/2, "
                  "n_ctx-1), summed in float64; exp(mean)",
        "generator": f"llama-cpp-python {llama_cpp.__version__}, n_threads={N_THREADS}",
    }


def gen_f32_logits(f32_model_path, kv_f32_golden):
    """llama.cpp's logits on an all-f32 copy of the model (kiln-quantize --type f32), f32 KV.

    Without quantized activations or f16 rounding anywhere, kiln and llama.cpp compute the same
    graph in f32: this isolates the forward pass itself from the arithmetic of quantized dots.
    """
    llm = load(f32_model_path, 512, "f32")
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
    llm = load(path, 512)
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
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    if args.f32_model:
        with open(os.path.join(GOLDEN_DIR, "smollm2_greedy_kv_f32.json")) as f:
            out = gen_f32_logits(args.f32_model, json.load(f))
        with open(os.path.join(GOLDEN_DIR, "smollm2_f32_logits.json"), "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        return
    for kv_type, name in (("f16", "smollm2_greedy.json"), ("f32", "smollm2_greedy_kv_f32.json")):
        greedy_out = gen_greedy(args.model, kv_type)
        with open(os.path.join(GOLDEN_DIR, name), "w") as f:
            json.dump(greedy_out, f, indent=1)
            f.write("\n")
    if not args.skip_perplexity:
        ppl = gen_perplexity(args.model, args.text, args.ctx)
        with open(os.path.join(GOLDEN_DIR, "smollm2_perplexity.json"), "w") as f:
            json.dump(ppl, f, indent=1)
            f.write("\n")
        print(f"perplexity: {ppl['perplexity']:.4f} over {ppl['n_scored']} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
