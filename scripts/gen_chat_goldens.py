#!/usr/bin/env python3
"""Generates tests/data/chat/goldens.json: chat conversations rendered through the real Jinja
chat templates with jinja2 (an independent implementation of what kiln renders natively in
lib/tokenizer/chat_template.cc).

Templates come from tests/data/chat/templates/<name>.jinja. smollm2.jinja is (re)written by this
script from the real model's GGUF metadata (tokenizer.chat_template) when the model is present;
the other files hold the models' official templates (from their tokenizer_config.json).

Rendering follows Hugging Face transformers' apply_chat_template: a sandboxed environment with
trim_blocks and lstrip_blocks, the loopcontrols extension and a raise_exception() global. A
template that raises gives a case with "error" instead of "expected".

Usage: python3 scripts/gen_chat_goldens.py [--model PATH]
"""

import argparse
import json
import os
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:  # pragma: no cover
    sys.exit("jinja2 is missing: pip install jinja2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAT_DIR = os.path.join(ROOT, "tests", "data", "chat")
TEMPLATE_DIR = os.path.join(CHAT_DIR, "templates")
DEFAULT_MODEL = os.path.join(
    os.environ.get("KILN_MODEL_DIR", os.path.expanduser("~/.cache/kiln")),
    "SmolLM2-135M-Instruct.Q4_1.gguf")

# template file stem -> (family kiln must detect, bos text, eos text)
TEMPLATES = {
    "smollm2": ("chatml", "<|im_start|>", "<|im_end|>"),
    "chatml": ("chatml", "", "<|im_end|>"),
    "qwen2": ("chatml", "", "<|im_end|>"),
    "llama2": ("llama2", "<s>", "</s>"),
    "llama3": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("mistral", "<s>", "</s>"),
    "mistral-v1": ("mistral-v1", "<s>", "</s>"),
    "mistral-v7": ("mistral-v7", "<s>", "</s>"),
    "gemma": ("gemma", "<bos>", "<eos>"),
    "gemma3": ("gemma3", "<bos>", "<eos>"),
    "deepseek": ("deepseek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-coder": ("deepseek-coder", "<｜begin▁of▁sentence｜>", "<|EOT|>"),
    "deepseek3": ("deepseek3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "phi3": ("phi3", "<s>", "<|endoftext|>"),
}


def m(role, content):
    return {"role": role, "content": content}


SYSTEM = "You are a terse assistant."
# (name, messages, add_generation_prompt values to render)
CONVERSATIONS = [
    ("system_user", [m("system", SYSTEM), m("user", "What is 2+2?")], (True, False)),
    ("user_only", [m("user", "Hello!")], (True, False)),
    ("multi_turn", [m("user", "Hi"), m("assistant", "Hello! How can I help?"),
                    m("user", "Tell me a joke.")], (True, False)),
    ("system_multi_turn", [m("system", SYSTEM), m("user", "Hi"), m("assistant", "Hello."),
                           m("user", "Bye")], (True,)),
    ("ends_with_assistant", [m("user", "Count to three."), m("assistant", "1, 2, 3")], (True, False)),
    ("unicode", [m("system", "Réponds en français. 日本語も OK."),
                 m("user", "Ünïcödé — 日本語 🚀 ½ \"quotes\" and 'apostrophes' \\ backslash")],
     (True,)),
    # Leading/trailing whitespace, including Unicode spaces that Python's str.strip() removes
    # (NBSP, ideographic space, line separator, NEL) and a zero-width space that it keeps.
    ("whitespace", [m("user", " \t\u3000\u00a0 padded question \u2028\n\u0085"),
                    m("assistant", "   spaced answer   \n"),
                    m("user", "\u200bzero width\u200b ")], (True,)),
    ("empty_content", [m("user", ""), m("assistant", ""), m("user", "")], (True,)),
    ("empty_system", [m("system", ""), m("user", "Hi")], (True,)),
    ("system_only", [m("system", SYSTEM)], (True, False)),
    ("newlines", [m("system", "Line one.\nLine two.\n"), m("user", "a\n\nb\n")], (True,)),
    ("late_system", [m("user", "a"), m("assistant", "b"), m("system", "c"), m("user", "d")], (True,)),
    ("two_systems", [m("system", "First."), m("system", "Second."), m("user", "Hi")], (True,)),
    ("assistant_first", [m("assistant", "I start."), m("user", "Then me.")], (True,)),
    ("two_users", [m("user", "One."), m("user", "Two.")], (True,)),
    ("system_assistant", [m("system", SYSTEM), m("assistant", "Hi")], (True,)),
]


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


def save_smollm2_template(model_path):
    path = os.path.join(TEMPLATE_DIR, "smollm2.jinja")
    if not os.path.exists(model_path):
        if os.path.exists(path):
            print(f"note: {model_path} missing; keeping the stored {path}")
            return
        sys.exit(f"the model {model_path} is missing and no stored smollm2.jinja exists")
    from gguf import GGUFReader
    reader = GGUFReader(model_path)
    source = reader.fields["tokenizer.chat_template"].contents()
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(source)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    save_smollm2_template(args.model)

    env = make_env()
    cases = []
    for stem, (family, bos, eos) in TEMPLATES.items():
        with open(os.path.join(TEMPLATE_DIR, stem + ".jinja"), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        for conv_name, messages, generation_prompts in CONVERSATIONS:
            for agp in generation_prompts:
                case = {
                    "name": f"{stem}/{conv_name}/{'gen' if agp else 'nogen'}",
                    "template": stem,
                    "family": family,
                    "bos_token": bos,
                    "eos_token": eos,
                    "add_generation_prompt": agp,
                    "messages": messages,
                }
                try:
                    case["expected"] = template.render(messages=messages, add_generation_prompt=agp,
                                                       bos_token=bos, eos_token=eos)
                except TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    out = os.path.join(CHAT_DIR, "goldens.json")
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        json.dump({"generator": "scripts/gen_chat_goldens.py", "jinja2": jinja2.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} cases ({n_err} expected errors) to {out}")


if __name__ == "__main__":
    main()
