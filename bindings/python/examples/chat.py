"""Streams a chat answer from a GGUF model, then continues the same conversation without blocking.

    python examples/chat.py [MODEL.gguf] ["question"]
"""

import sys
from pathlib import Path

import kiln

path = sys.argv[1] if len(sys.argv) > 1 else Path.home() / ".cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf"
question = sys.argv[2] if len(sys.argv) > 2 else "Name three fruits."

shown = []


def progress(fraction: float) -> None:
    if int(fraction * 4) not in shown:  # 0%, 25%, 50%, 75%, 100%
        shown.append(int(fraction * 4))
        print(f"loading {fraction:.0%}", file=sys.stderr)


with kiln.Model(path, progress=progress) as model:
    prompt = model.apply_chat_template([{"role": "user", "content": question}])
    with model.cache(n_ctx=2048) as cache, cache.session(temperature=0.7, seed=42) as session:
        # Blocking: an iterator of text pieces.
        with session.stream(64, prompt=prompt, parse_special=True, stop="<|im_end|>") as pieces:
            for piece in pieces:
                print(piece, end="", flush=True)
        print(f"\n[{pieces.result.stop_reason.name}, {pieces.result.n_tokens} tokens]")

        # Non-blocking: submit, then step the cache yourself (a game loop would do one step per frame).
        follow_up = model.apply_chat_template([{"role": "user", "content": "And one vegetable?"}])
        session.submit("<|im_end|>\n" + follow_up, parse_special=True, max_tokens=32, stop="<|im_end|>")
        text = b""
        while not (polled := session.poll()).done:
            text += polled.text
            cache.step(time_budget_ms=16)
        text += polled.text
        print(text.decode("utf-8", "replace"))
