"""Training prompts from an offline, reproducible source: the docstrings of the Python standard
library of the interpreter that runs this (Debian 12: python3.11). Nothing is downloaded.

Each public function or class with a docstring in MODULES gives one prompt, its template chosen by
a hash of its name, so the list depends only on the Python version. The benchmark's chat prompts
(bench/spec_bench.cc) are general questions and share none of these.
"""
import hashlib
import importlib
import inspect

MODULES = [
    "os", "os.path", "re", "json", "math", "random", "string", "textwrap", "itertools",
    "functools", "collections", "datetime", "time", "shutil", "subprocess", "pathlib", "csv",
    "statistics", "heapq", "bisect", "difflib", "fractions", "decimal", "hashlib", "base64",
    "urllib.parse", "html", "socket", "threading", "queue", "logging", "argparse", "tempfile",
    "glob", "fnmatch", "zipfile", "gzip", "pickle", "copy", "enum", "typing", "unittest",
    "calendar", "operator", "struct", "uuid", "secrets", "sqlite3", "email.utils", "shlex",
]

TEMPLATES = [
    "Explain what the Python function {name} does. Its documentation says:\n{doc}",
    "Write a short example that uses {name} in Python and explain it. Documentation:\n{doc}",
    "Summarize in plain words: {doc}",
    "I am learning Python. What is {name} for, and when should I use it?",
    "Describe {name} to a beginner, with one code example.",
]


def _first_paragraph(doc, limit=400):
    para = doc.strip().split("\n\n")[0]
    return " ".join(para.split())[:limit]


def prompts():
    out = []
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 40:
                continue
            name = f"{mod_name}.{attr}"
            h = int(hashlib.sha256(name.encode()).hexdigest(), 16)
            out.append(TEMPLATES[h % len(TEMPLATES)].format(name=name, doc=_first_paragraph(doc)))
    # A fixed shuffle (not Python's salted hash) so a prefix of the list covers every module.
    out.sort(key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    return out


if __name__ == "__main__":
    ps = prompts()
    print(len(ps))
    print(ps[0])
