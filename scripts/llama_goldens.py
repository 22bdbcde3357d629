"""What the llama.cpp golden generators (scripts/gen_*_goldens.py) share.

llama-cpp-python (an independent engine) loaded the same way everywhere, greedy decoding that
records the top-2 logits of each step, chat prompts rendered like transformers'
apply_chat_template, llama-perplexity's method, kiln-mkmodel's files with their hash, and the
writing of a golden file. Needs pip install llama-cpp-python==0.3.36 jinja2 numpy.
"""

import json
import math
import os
import subprocess
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
MODEL_DIR = os.environ.get("KILN_MODEL_DIR", os.path.expanduser("~/.cache/kiln"))
DEFAULT_TEXT = os.path.join(ROOT, "tests", "data", "text", "gpl-3.0.txt")
MKMODEL = os.path.join(ROOT, "build", "tools", "kiln-mkmodel", "kiln-mkmodel")

N_THREADS = 2
SEED = 1234

# KV cache types: llama.cpp's default is f16; "f32" keeps attention entirely in f32.
KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}


def load(path, n_ctx, kv_type="f16", logits_all=False):
    """logits_all off (llama.cpp's default) computes the last batch token's logits only: the last
    layer then runs its feed-forward block for that token alone, which for f32 and f16 weights
    decides the summation order of those matmuls. flash_attn off: llama.cpp's classic attention
    path (KQ and KQV as matmuls)."""
    return llama_cpp.Llama(model_path=path, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                           n_ctx=n_ctx, n_batch=512, seed=SEED, logits_all=logits_all,
                           flash_attn=False, type_k=KV_TYPES[kv_type], type_v=KV_TYPES[kv_type],
                           verbose=False)


def last_logits(llm):
    """The last evaluated token's logits, whether or not logits_all is on."""
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)


def top2(row):
    # Ties go to the lowest id: a stable sort on -logit keeps id order among equals.
    order = np.argsort(-row, kind="stable")[:2]
    return [int(order[0]), int(order[1])], [float(row[order[0]]), float(row[order[1]])]


def greedy(llm, prompt_ids, n_new):
    """The prompt in one batch, then one token per call; argmax with ties to the lowest id,
    stopping early only at an end-of-generation token. Returns the generated ids, the top-2 ids
    and logits at each step, and the step that ended at end-of-generation (or None)."""
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


def greedy_case(llm, prompt_ids, n_new):
    """One golden case: the prompt's ids and greedy's record of its continuation."""
    generated, top_ids, top_logits, stop = greedy(llm, prompt_ids, n_new)
    return {
        "prompt_ids": prompt_ids,
        "generated_ids": generated,
        "stopped_at_eog": stop,
        "top2_ids": top_ids,
        "top2_logits": top_logits,
    }


def render_chat(template_source, user_text, bos_token, eos_token):
    """Renders one user message like transformers' apply_chat_template (sandboxed environment,
    trim_blocks, lstrip_blocks, add_generation_prompt)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(template_source)
    return template.render(messages=[{"role": "user", "content": user_text}],
                           add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token)


def chat_cases(llm, raw_prompts, chat_prompts, render, n_new, bos_on_chat):
    """Greedy cases of raw prompts (tokenized as is, parse_special off, add_special on) and of
    chat prompts (render(user_text), parse_special on; add_special as bos_on_chat says)."""
    cases = []
    for templated, prompts in ((False, raw_prompts), (True, chat_prompts)):
        for user_text in prompts:
            text = render(user_text) if templated else user_text
            prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=not templated or bos_on_chat,
                                      special=templated)
            case = {"user_text": user_text, "templated": templated, "prompt": text}
            case.update(greedy_case(llm, prompt_ids, n_new))
            case["text"] = llm.detokenize(case["generated_ids"],
                                          special=True).decode("utf-8", "replace")
            cases.append(case)
            print(f"{'chat' if templated else 'raw '} {len(prompt_ids):3d}+"
                  f"{len(case['generated_ids']):2d} {case['text'][:60]!r}", file=sys.stderr)
    return cases


def perplexity(model_path, text_path, n_ctx, method, generator):
    """llama-perplexity's method (examples/perplexity/perplexity.cpp, perplexity()) with
    llama.cpp's own eval and logits: the text tokenized with add_special on and parse_special
    off, cut into floor(n_tokens / n_ctx) chunks of n_ctx tokens, each evaluated from an empty KV
    cache (its first token replaced by BOS if the vocab's add_bos is set); for j in
    [n_ctx/2, n_ctx - 1) the negative log of softmax(logits[j])[token j+1] summed in float64;
    perplexity = exp(sum / count). KV cache f16 (llama-perplexity's default)."""
    llm = load(model_path, n_ctx, logits_all=True)
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
        "method": method,
        "generator": generator,
    }


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def make_model(mkmodel, shape, type_name, seed, path):
    """Writes kiln-mkmodel's random-weight model; returns its size and FNV-1a 64 hash (the tests
    regenerate the file through the library and compare both, so a stale golden is caught)."""
    subprocess.run([mkmodel, "--shape", shape, "--type", type_name, "--seed", str(seed), "--out",
                    path], check=True, stdout=subprocess.DEVNULL)
    with open(path, "rb") as f:
        data = f.read()
    return len(data), f"{fnv1a64(data):016x}"


def write_golden(name, content):
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    with open(os.path.join(GOLDEN_DIR, name), "w") as f:
        json.dump(content, f, indent=1)
        f.write("\n")
