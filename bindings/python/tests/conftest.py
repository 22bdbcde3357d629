"""Fixtures: the default model (SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch_model.sh into
$KILN_MODEL_DIR or ~/.cache/kiln), loaded once for the whole run, and a small cache on it."""

import os
from pathlib import Path

import pytest

import kiln

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    directory = os.environ.get("KILN_MODEL_DIR") or str(Path.home() / ".cache" / "kiln")
    path = Path(directory) / MODEL_FILE
    if not path.is_file():
        pytest.fail(f"default model {path} is missing: run scripts/fetch_model.sh")
    return path


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def model(model_path):
    with kiln.Model(model_path) as m:
        yield m


@pytest.fixture(scope="session")
def cache(model):
    # 1024 tokens per session keeps the KV pool (one context by default) small.
    with model.cache(n_ctx=1024) as c:
        yield c


CHAT_PROMPT = "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n"
