"""Fixtures: the default model (SmolLM2-135M-Instruct Q4_1, fetched by scripts/fetch_model.sh into
$KILN_MODEL_DIR or ~/.cache/kiln), loaded once for the whole run, a small cache on it, and the
files scripts/test_bindings.sh writes into $KILN_BINDINGS_FIXTURES with kiln-mkmodel and
kiln-mkeagle (a tiny deepseek2 model, an EAGLE head for the default model)."""

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


def fixture_file(name: str) -> Path:
    directory = os.environ.get("KILN_BINDINGS_FIXTURES")
    if not directory:
        pytest.fail("KILN_BINDINGS_FIXTURES is not set: run scripts/test_bindings.sh, which writes the fixtures")
    path = Path(directory) / name
    if not path.is_file():
        pytest.fail(f"fixture {path} is missing: run scripts/test_bindings.sh")
    return path


@pytest.fixture(scope="session")
def deepseek2_path() -> Path:
    return fixture_file("tiny-deepseek2.gguf")


@pytest.fixture(scope="session")
def eagle_head_path() -> Path:
    return fixture_file("SmolLM2-135M-Instruct.eagle.gguf")


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
