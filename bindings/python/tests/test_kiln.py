"""The Python binding on the default model: every part of the C API it wraps, greedy (so results
are exact), with few tokens so the whole file runs in seconds."""

import math
import threading
from pathlib import Path

import pytest

import kiln
from kiln import KilnError, Status, StopReason

from conftest import CHAT_PROMPT

MAX = 12  # tokens per generate: enough to compare texts, cheap on two cores


def chat_session(cache, **sampling):
    s = cache.session(**sampling)
    s.append(CHAT_PROMPT, parse_special=True)
    return s


def test_versions():
    assert kiln.version().count(".") == 2
    assert kiln.abi_version() == 1
    assert kiln.cpu_info()
    assert "cpu" in kiln.backends().lower() or kiln.cpu_info().split()[0] in kiln.backends()


def test_load_reports_progress(model_path):
    seen = []
    with kiln.Model(model_path, progress=lambda p: seen.append(p)) as m:
        assert m.info.n_vocab > 0
    assert seen, "the progress callback was never called"
    assert seen == sorted(seen) and 0.0 <= seen[0] and seen[-1] == pytest.approx(1.0)


def test_load_cancelled_by_progress(model_path):
    with pytest.raises(KilnError) as e:
        kiln.Model(model_path, progress=lambda p: True)
    assert e.value.status == Status.CANCELLED


def test_load_logs_its_lines(model_path, tmp_path):
    lines = []
    with kiln.Model(model_path, log=lambda level, line: lines.append((level, line))):
        pass
    assert any(level == kiln.LogLevel.INFO and line for level, line in lines), lines
    lines.clear()
    with pytest.raises(KilnError) as e:
        kiln.Model(tmp_path / "missing.gguf", log=lambda level, line: lines.append((level, line)))
    # A failed load logs its error, the message the exception carries.
    assert (kiln.LogLevel.ERROR, e.value.message) in lines, lines

    def boom(level, line):
        raise ValueError("from log")

    with pytest.raises(ValueError, match="from log"):
        kiln.Model(model_path, log=boom)


def test_exception_in_progress_is_reraised(model_path):
    def boom(_):
        raise ValueError("from progress")

    with pytest.raises(ValueError, match="from progress"):
        kiln.Model(model_path, progress=boom)


def test_load_errors_carry_status_and_message(tmp_path):
    with pytest.raises(KilnError) as e:
        kiln.Model(tmp_path / "missing.gguf")
    assert e.value.status == Status.IO
    assert "missing.gguf" in e.value.message
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(KilnError) as e:
        kiln.Model(bad)
    assert e.value.status == Status.FORMAT
    assert e.value.message and "KILN_ERR_FORMAT" in str(e.value)


def test_info_and_metadata(model):
    info = model.info
    assert info.architecture == "llama"
    assert info.n_vocab == 49152 and info.n_layer == 30
    meta = model.metadata
    # Values are rendered as text: strings quoted, as kiln-inspect prints them.
    assert meta["general.architecture"] == '"llama"'
    assert model.meta("general.architecture") == '"llama"'
    assert len(meta) > 10
    assert model.meta("no.such.key") is None
    assert model.is_eog(info.token_eos)
    assert not model.is_eog(model.tokenize("hello")[0])


def test_tokenize_round_trip(model):
    text = "Hello, world! Ünïcödé 🙂"
    tokens = model.tokenize(text)
    assert len(tokens) > 3
    assert model.detokenize(tokens) == text
    special = model.tokenize("<|im_start|>user", parse_special=True)
    plain = model.tokenize("<|im_start|>user")
    assert len(special) < len(plain)
    assert model.detokenize(special, render_special=True) == "<|im_start|>user"
    assert model.tokenize("") == []


def test_detokenize_bad_token_names_it(model):
    with pytest.raises(KilnError) as e:
        model.detokenize([1, 2, 10**6])
    assert e.value.status == Status.INVALID_ARGUMENT
    assert "2" in e.value.message  # the index of the bad id


def test_chat_template(model):
    messages = [{"role": "system", "content": "Be brief."}, ("user", "Hi")]
    own = model.apply_chat_template(messages)
    assert "<|im_start|>user\nHi<|im_end|>" in own
    assert own.endswith("<|im_start|>assistant\n")
    chatml = model.apply_chat_template(messages, template="chatml", add_generation_prompt=False)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in chatml
    assert not chatml.endswith("assistant\n")
    with pytest.raises(KilnError) as e:
        model.apply_chat_template([("wizard", "x")])
    assert e.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(KilnError) as e:
        model.apply_chat_template([("user", "x")], template="no-such-family")
    # kiln.h lists UNSUPPORTED for an unrecognised template; the library answers a name it does
    # not know with INVALID_ARGUMENT. Either way the message lists the families it knows.
    assert e.value.status in (Status.INVALID_ARGUMENT, Status.UNSUPPORTED)
    assert "chatml" in e.value.message


def test_cache_and_session(model, cache):
    before = cache.stats.n_sequences
    with chat_session(cache) as s:
        assert cache.stats.n_sequences == before + 1
        prompt = model.tokenize(CHAT_PROMPT, parse_special=True)
        assert s.tokens == prompt and len(s) == len(prompt)
        logits = s.logits
        assert len(logits) == model.info.n_vocab
        assert all(math.isfinite(x) for x in logits[:100])
    assert s.closed
    assert cache.stats.n_sequences == before
    with pytest.raises(KilnError) as e:
        s.append("x")
    assert e.value.status == Status.INVALID_ARGUMENT and "closed" in e.value.message


def test_generate_and_stream_agree(cache):
    with chat_session(cache) as a:
        seen = []
        result = a.generate(MAX, callback=lambda t, piece: seen.append((t, piece)))
    assert result.n_tokens == MAX and result.stop_reason == StopReason.MAX_TOKENS
    assert len(result.tokens) == MAX and result.text
    assert "".join(p for _, p in seen) == result.text
    with chat_session(cache) as b:
        stream = b.stream(MAX)
        pieces = list(stream)
        assert len(pieces) > 1
        assert "".join(pieces) == result.text
        assert stream.tokens == result.tokens
        assert stream.result.stop_reason == StopReason.MAX_TOKENS
        assert b.n_tokens == len(b.tokens) and b.tokens[-MAX:] == result.tokens


def test_stream_with_prompt_and_early_exit(cache):
    with cache.session() as s:
        with s.stream(64, prompt=CHAT_PROMPT, parse_special=True) as stream:
            first = next(stream)
            assert first
        # Leaving the with-block cancelled the request: the session takes calls again.
        assert stream.result is not None
        assert stream.result.stop_reason == StopReason.CANCELLED
        assert s.n_tokens < len(s.model.tokenize(CHAT_PROMPT, parse_special=True)) + 64
        s.rewind(1)


def test_stop_string(cache):
    with chat_session(cache) as s:
        full = s.fork()
        text = full.generate(MAX).text
        full.close()
        word = text.split()[1]
        result = s.generate(MAX, stop=[word])
    assert result.stop_reason == StopReason.STRING
    assert word not in result.text


def test_callback_stops_and_reraises(cache):
    with chat_session(cache) as s:
        stopped = s.generate(MAX, callback=lambda t, p: t >= 0)
        assert stopped.stop_reason == StopReason.CALLBACK and stopped.n_tokens == 1

        def boom(t, p):
            raise RuntimeError("from the token callback")

        with pytest.raises(RuntimeError, match="token callback"):
            s.generate(MAX, callback=boom)


def test_cancel_from_another_thread(cache):
    with chat_session(cache) as s:
        first_token = threading.Event()
        cancelled = threading.Event()

        def canceller():
            first_token.wait(30)
            s.cancel()
            cancelled.set()

        def on_token(token, piece):
            first_token.set()
            cancelled.wait(30)  # the next decode step comes after the cancel

        thread = threading.Thread(target=canceller)
        thread.start()
        result = s.generate(64, callback=on_token)
        thread.join()
    assert result.stop_reason == StopReason.CANCELLED
    assert 1 <= result.n_tokens < 64


def test_fork_is_independent(cache):
    with chat_session(cache) as s:
        prompt_len = s.n_tokens
        with s.fork() as f:
            assert f.tokens == s.tokens
            a = s.generate(MAX)
            assert f.n_tokens == prompt_len  # the parent's generate did not touch the fork
            b = f.generate(MAX)
        assert a.tokens == b.tokens and a.text == b.text


def test_rewind_regenerates(cache):
    with chat_session(cache) as s:
        prompt = s.tokens
        first = s.generate(MAX)
        s.rewind(MAX)
        assert s.tokens == prompt
        assert s.generate(MAX).tokens == first.tokens
        with pytest.raises(KilnError) as e:
            s.rewind(10**6)
        assert e.value.status == Status.OUT_OF_RANGE
        assert s.n_tokens == len(prompt) + MAX


def test_logprobs_and_scoring(model, cache):
    with chat_session(cache, temperature=0.0, n_logprobs=5) as s:
        greedy_next = max(range(model.info.n_vocab), key=s.logits.__getitem__)
        result = s.generate(1)
        top = s.logprobs()
    assert len(top) == 5
    assert top[0].token == result.tokens[0] == greedy_next
    assert all(a.logprob >= b.logprob for a, b in zip(top, top[1:]))
    assert all(x.logprob <= 0 for x in top)
    with cache.session() as scorer:
        tokens = model.tokenize("The capital of France is Paris.")
        scores = scorer.score(tokens)
    assert len(scores) == len(tokens) - 1 and all(x <= 0 and math.isfinite(x) for x in scores)


def test_ngram_strategy_is_lossless_with_metrics(cache):
    # A prompt that repeats itself, so prompt lookup finds drafts.
    text = "one two three four five six seven eight. " * 4 + "one two three"
    with cache.session() as plain:
        plain.append(text)
        expected = plain.generate(MAX).tokens
    with kiln.NgramStrategy(max_draft=4) as strategy, cache.session() as s:
        s.append(text)
        s.set_strategy(strategy)
        assert s.generate(MAX).tokens == expected
        m = s.spec_metrics
        assert m.steps > 0 and m.drafted > 0 and 0 <= m.accepted <= m.drafted
        assert m.generated >= MAX - 1 and m.target_passes_per_token <= 1.0
        s.set_strategy(None)
    with pytest.raises(KilnError) as e:
        kiln.NgramStrategy(max_draft=0)
    assert e.value.status == Status.INVALID_ARGUMENT and "max_draft" in e.value.message
    with pytest.raises(TypeError):
        kiln.NgramStrategy(no_such=1)


def test_draft_strategy(model, model_path, cache, tmp_path):
    # The model drafting for itself: a draft model needs only the target's vocabulary size.
    with cache.session() as plain:
        plain.append(CHAT_PROMPT, parse_special=True)
        expected = plain.generate(MAX).tokens
    with kiln.DraftStrategy(model, model_path, max_draft=3, n_threads=1) as draft, chat_session(cache) as s:
        s.set_strategy(draft)
        assert s.generate(MAX).tokens == expected
        m = s.spec_metrics
        assert m.drafted > 0 and 0 < m.accepted <= m.drafted, m
        with pytest.raises(KilnError) as e:
            s.save_state()  # a draft model cannot save its state
        assert e.value.status == Status.UNSUPPORTED
        assert len(s.save_state(strategy=False)) > 0
    with pytest.raises(KilnError) as e:
        kiln.DraftStrategy(model, tmp_path / "missing-draft.gguf")
    assert e.value.status == Status.IO


HEAD_PATH = Path(__file__).resolve().parents[3] / "models" / "SmolLM2-135M-Instruct.medusa.gguf"


def test_medusa_strategy(model, model_path, cache, tmp_path):
    # The repository's trained head for the default model: greedy output is plain decoding's.
    with cache.session() as plain:
        plain.append(CHAT_PROMPT, parse_special=True)
        expected = plain.generate(MAX).tokens
    with kiln.MedusaStrategy(model, HEAD_PATH, n_threads=1) as medusa, chat_session(cache) as s:
        s.set_strategy(medusa)
        assert s.generate(MAX).tokens == expected
        m = s.spec_metrics
        assert m.steps > 0 and m.drafted > 0 and 0 <= m.accepted <= m.drafted, m
        assert m.mean_accepted_per_step == pytest.approx(m.accepted / m.steps)
        assert 0 < m.target_passes_per_token <= 1.0
    # Without the n-gram candidates merged in: the heads' tree alone, still exact.
    with kiln.MedusaStrategy(model, HEAD_PATH, n_threads=1, merge_ngram=False) as medusa, \
            chat_session(cache) as s:
        s.set_strategy(medusa)
        assert s.generate(MAX).tokens == expected
    with pytest.raises(KilnError) as e:
        kiln.MedusaStrategy(model, model_path)  # a model, not a head trained for it
    assert e.value.status == Status.INVALID_ARGUMENT and "not a medusa head" in e.value.message
    missing = tmp_path / "missing.medusa.gguf"
    with pytest.raises(KilnError) as e:
        kiln.MedusaStrategy(model, missing)
    assert e.value.status == Status.IO and str(missing) in e.value.message
    with pytest.raises(KilnError) as e:
        kiln.MedusaStrategy(model, HEAD_PATH, max_draft=-1)
    assert e.value.status == Status.INVALID_ARGUMENT and "max_draft" in e.value.message


def test_medusa_typical_acceptance_is_reported_lossy(model, cache):
    # Opt-in and lossy: when sampling, every draft token it keeps is counted in accepted_lossy;
    # at temperature 0 it verifies greedily (plain decoding's tokens, nothing lossy).
    with chat_session(cache) as plain:
        expected = plain.generate(MAX).tokens
    with kiln.MedusaStrategy(model, HEAD_PATH, typical_acceptance=True) as medusa:
        with chat_session(cache) as s:
            s.set_strategy(medusa)
            assert s.generate(MAX).tokens == expected
            assert s.spec_metrics.accepted_lossy == 0
        with chat_session(cache, temperature=0.8, seed=5) as s:
            s.set_strategy(medusa)
            s.generate(4 * MAX)
            m = s.spec_metrics
            assert m.steps > 0 and m.accepted_lossy == m.accepted, m
    with pytest.raises(KilnError) as e:
        kiln.MedusaStrategy(model, HEAD_PATH, typical_acceptance=True, typical_epsilon=2.0)
    assert e.value.status == Status.INVALID_ARGUMENT and "epsilon" in e.value.message


def test_submit_poll_step_matches_blocking(cache):
    with chat_session(cache) as ref:
        expected = ref.generate(MAX)
    with cache.session() as s:
        s.submit(CHAT_PROMPT, parse_special=True, max_tokens=MAX)
        with pytest.raises(KilnError) as e:
            s.append("busy")
        assert e.value.status == Status.BUSY
        text, tokens, steps = b"", [], 0
        while True:
            polled = s.poll()
            text += polled.text
            tokens += polled.tokens
            if polled.done:
                break
            step = cache.step(time_budget_ms=5)
            steps += step.n_steps
        assert polled.error is None and polled.stop_reason == StopReason.MAX_TOKENS
        assert steps >= MAX
        assert tokens == expected.tokens and text.decode() == expected.text
        s.append(" more")  # takes calls again after done


def test_worker_with_callbacks(cache):
    done = threading.Event()
    results = []
    pieces = []
    with cache.session() as s:
        cache.start_worker()
        try:
            s.submit(
                CHAT_PROMPT,
                parse_special=True,
                max_tokens=MAX,
                on_token=lambda t, p: pieces.append(p),
                on_done=lambda r: (results.append(r), done.set()),
            )
            assert done.wait(60)
        finally:
            cache.stop_worker()
        assert s.poll().done
    assert results[0].error is None and results[0].n_tokens == MAX
    assert "".join(pieces)


def test_submit_errors(cache):
    with cache.session() as s:
        with pytest.raises(KilnError) as e:
            s.submit(max_tokens=4)  # empty session, no prompt
        assert e.value.status == Status.INVALID_ARGUMENT
        with pytest.raises(KilnError) as e:
            s.poll()  # nothing was ever submitted
        assert e.value.status == Status.INVALID_ARGUMENT
        s.submit(CHAT_PROMPT, parse_special=True, max_tokens=MAX)
        s.cancel()  # queued: ends with CANCELLED and keeps nothing
        while not (polled := s.poll()).done:
            cache.step()
        assert polled.error is not None and polled.error.status == Status.CANCELLED
        assert s.n_tokens == 0


def test_saved_state_continues_identically(cache, tmp_path):
    with chat_session(cache) as s:
        s.generate(4)
        state = s.save_state()
        small = s.save_state(kv=False)
        assert len(small) < len(state)
        s.save_state_file(tmp_path / "npc.state")
        expected = s.generate(MAX).tokens
    for load in (lambda r: r.load_state(state), lambda r: r.load_state(small),
                 lambda r: r.load_state_file(tmp_path / "npc.state")):
        with cache.session() as r:
            load(r)
            assert r.generate(MAX).tokens == expected
    with cache.session() as r:
        with pytest.raises(KilnError) as e:
            r.load_state(state[: len(state) // 2])
        assert e.value.status == Status.FORMAT
        assert r.n_tokens == 0


def test_closing_model_closes_its_handles(model_path):
    m = kiln.Model(model_path)
    c = m.cache(n_ctx=256)
    s = c.session()
    s.append("hi")
    m.close()
    assert s.closed and c.closed and m.closed
    with pytest.raises(KilnError):
        m.tokenize("x")


def test_bad_arguments_map_to_errors(cache):
    with pytest.raises(KilnError) as e:
        cache.model.cache(block_size=0)
    assert e.value.status == Status.INVALID_ARGUMENT and "block_size" in e.value.message
    with pytest.raises(KilnError) as e:
        kiln.Sampler(repeat_penalty=0.0)
    assert e.value.status == Status.INVALID_ARGUMENT
    with cache.session() as s:
        with pytest.raises(KilnError) as e:
            s.generate(4)  # empty session
        assert e.value.status == Status.INVALID_ARGUMENT
        with pytest.raises(KilnError) as e:
            s.append_tokens([10**7])
        assert e.value.status == Status.INVALID_ARGUMENT


def test_struct_layouts_match_the_header():
    # sizeof of each struct in C (gcc, LP64: x86-64 and aarch64 Linux); a field added to kiln.h
    # but not to kiln/_ffi.py shows up here.
    from ctypes import sizeof

    from kiln import _ffi

    expected = {
        "ModelParams": 56, "ModelInfo": 88, "CacheParams": 72, "CacheStats": 112,
        "SamplerParams": 72, "GenerateParams": 40, "GenerateResult": 12, "RequestParams": 96,
        "PollResult": 56, "StepParams": 24, "StepResult": 32, "StateParams": 12,
        "NgramParams": 40, "DraftParams": 32, "MedusaParams": 28, "EagleParams": 36,
        "SpecMetrics": 64,
    }
    assert {name: sizeof(getattr(_ffi, name)) for name in expected} == expected
    # The fields added after the ABI 1 baseline, at their offsetof in kiln_cache_params.
    offsets = {
        "llama_cpp_order": 36, "step_tokens": 40, "backend": 44, "cuda_device": 48, "mla_prefill": 52,
        "sliding_window_sessions": 56, "swa_full": 60, "pin_threads": 64,
    }
    assert {name: getattr(_ffi.CacheParams, name).offset for name in offsets} == offsets
    # And in kiln_cache_stats.
    offsets = {
        "kv_bytes_in_use": 80, "sliding_blocks_total": 88, "sliding_blocks_used": 92,
        "sliding_blocks_released": 96, "sliding_block_bytes": 104,
    }
    assert {name: getattr(_ffi.CacheStats, name).offset for name in offsets} == offsets
    # And in kiln_eagle_params and kiln_medusa_params.
    assert _ffi.EagleParams.merge_ngram.offset == 20
    assert _ffi.MedusaParams.merge_ngram.offset == 12
    # Their typical-acceptance fields, and kiln_spec_metrics.accepted_lossy.
    assert [getattr(_ffi.EagleParams, f).offset for f in ("typical_acceptance", "typical_epsilon",
                                                         "typical_delta")] == [24, 28, 32]
    assert [getattr(_ffi.MedusaParams, f).offset for f in ("typical_acceptance", "typical_epsilon",
                                                          "typical_delta")] == [16, 20, 24]
    assert _ffi.SpecMetrics.accepted_lossy.offset == 56


def test_stream_raises_a_failed_request(cache):
    with cache.session() as s:
        stream = s.stream(8, prompt=CHAT_PROMPT, parse_special=True)
        s.cancel()  # still queued: the request fails with CANCELLED and keeps nothing
        with pytest.raises(KilnError) as e:
            next(stream)
        assert e.value.status == Status.CANCELLED
        assert stream.result.error is e.value
        assert list(stream) == []  # raised once, then exhausted
        assert s.n_tokens == 0
        s.append("ok")  # the session takes calls again


def test_cache_backend_cpu_and_cuda_fallback(model, cache):
    assert cache.backend.startswith("cpu") and "requested" not in cache.backend
    with model.cache(n_ctx=256, n_threads=2, pin_threads=True) as c:
        assert "workers pinned" in c.backend, c.backend
    with model.cache(n_ctx=256, backend=kiln.Backend.CUDA, cuda_device=0) as c:
        chosen = c.backend
        if chosen.startswith("cpu"):
            # No CUDA module, driver or device here: the cache still runs, on the CPU, and says why.
            prefix = "; cuda requested, running on the CPU: "
            assert prefix in chosen, chosen
            assert chosen.split(prefix, 1)[1].strip(), chosen
        else:
            assert chosen.startswith("cuda"), chosen
        with c.session() as s:
            s.append("Hello")
            assert s.generate(2).n_tokens == 2
    with pytest.raises(KilnError) as e:
        model.cache(n_ctx=256, backend=7)  # not a kiln_backend_kind
    assert e.value.status == Status.INVALID_ARGUMENT and "backend" in e.value.message


def test_cache_step_tokens(model):
    prompt = model.tokenize("The quick brown fox jumps over the lazy dog. " * 12)
    assert len(prompt) > 100
    # One step computes the whole prompt (under the 256-token chunk) by default, 48 tokens with
    # step_tokens=48. New caches: no prefix cache hit.
    for step_tokens, expected in ((None, len(prompt)), (48, 48)):
        with model.cache(n_ctx=256, step_tokens=step_tokens) as c, c.session() as s:
            s.submit(tokens=prompt, max_tokens=0)
            assert c.step().n_tokens == expected
            while not s.poll().done:
                c.step()
            assert s.n_tokens == len(prompt)
    with pytest.raises(KilnError) as e:
        model.cache(n_ctx=256, step_tokens=0)
    assert e.value.status == Status.INVALID_ARGUMENT and "step_tokens" in e.value.message


def test_mla_prefill_on_deepseek2(deepseek2_path):
    # A prompt of more than 128 tokens in one chunk: measured runs it decompressed, whose logits
    # agree with the absorbed form's to float rounding but not bit for bit.
    with kiln.Model(deepseek2_path) as m:
        assert m.info.architecture == "deepseek2"
        prompt = m.tokenize("the quick brown fox jumps " * 30)
        assert len(prompt) > 128
        logits = {}
        for mode in (kiln.MlaPrefill.ABSORBED, kiln.MlaPrefill.MEASURED):
            with m.cache(n_threads=2, mla_prefill=mode) as c, c.session() as s:
                s.append_tokens(prompt)
                logits[mode] = s.logits
        absorbed, measured = logits[kiln.MlaPrefill.ABSORBED], logits[kiln.MlaPrefill.MEASURED]
        assert absorbed != measured, "measured ran the absorbed form (bitwise equal logits)"
        scale = max(abs(x) for x in absorbed)
        assert max(abs(a - b) for a, b in zip(absorbed, measured)) <= 1e-3 * scale
        with pytest.raises(KilnError) as e:
            m.cache(mla_prefill=7)  # not a kiln_mla_prefill
        assert e.value.status == Status.INVALID_ARGUMENT and "mla_prefill 7" in e.value.message


def test_eagle_strategy(model, model_path, cache, eagle_head_path):
    # An untrained head from kiln-mkeagle: greedy output is still plain decoding's (exact
    # verification), and it drafts.
    with chat_session(cache) as plain:
        expected = plain.generate(MAX).tokens
    with kiln.EagleStrategy(model, eagle_head_path, top_k=4, max_depth=3, n_threads=1) as eagle, \
            chat_session(cache) as s:
        s.set_strategy(eagle)
        assert s.generate(MAX).tokens == expected
        m = s.spec_metrics
        assert m.steps > 0 and m.drafted > 0 and 0 <= m.accepted <= m.drafted, m
    # Without the n-gram candidates merged in: the head's tree alone, still exact.
    with kiln.EagleStrategy(model, eagle_head_path, top_k=4, max_depth=3, n_threads=1,
                            merge_ngram=False) as eagle, chat_session(cache) as s:
        s.set_strategy(eagle)
        assert s.generate(MAX).tokens == expected
    with pytest.raises(KilnError) as e:
        kiln.EagleStrategy(model, eagle_head_path, top_k=65)
    assert e.value.status == Status.INVALID_ARGUMENT and "top_k" in e.value.message
    with pytest.raises(KilnError) as e:
        kiln.EagleStrategy(model, model_path)  # a model, not an eagle head
    assert e.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(TypeError):
        kiln.EagleStrategy(model, eagle_head_path, depth=3)


def test_gguf_inspection(model_path, eagle_head_path, tmp_path):
    with kiln.GgufFile(model_path) as g:
        assert g.metadata["general.architecture"] == '"llama"'
        assert g.unsupported == []
    # An eagle head is a valid GGUF that kiln cannot run as a model: the problems are listed.
    with kiln.GgufFile(eagle_head_path) as g:
        assert g.metadata["general.architecture"] == '"eagle"'
        assert g.unsupported and "eagle" in g.unsupported[0]
    with pytest.raises(KilnError) as e:
        kiln.GgufFile(tmp_path / "missing.gguf")
    assert e.value.status == Status.IO
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(KilnError) as e:
        kiln.GgufFile(bad)
    assert e.value.status == Status.FORMAT
