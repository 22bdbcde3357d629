#!/usr/bin/env python3
"""Headless test of kiln-game with the default model.

usage: run_test.py KILN_GAME MAX_P99_MS

Runs the scripted dialogue three times with one seed: plainly, with a save at frame K, and loaded
from that save. Checks that all three give the same transcript (a fixed seed gives one dialogue,
and a saved game continues exactly as the unsaved one) and that kiln's p99 time per frame stays
within MAX_P99_MS in the plain run (the game's own check, its exit status): the game thread's CPU
time in kiln_cache_step (--check-clock cpu; samples/game/CMakeLists.txt says why), over
TIMED_FRAMES frames so that the p99 is not just the slowest frame. Exit 77 (skipped) without the
model.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

MODEL = os.path.expanduser("~/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf")
ROUNDS = 2
NPCS = 4
TIMED_FRAMES = 200


def run(game, args):
    start = time.monotonic()
    proc = subprocess.run([game] + args, capture_output=True, text=True, timeout=240)
    seconds = time.monotonic() - start
    print(f"$ kiln-game {' '.join(args)}  ({seconds:.1f} s, exit {proc.returncode})")
    print(proc.stdout, end="")
    if proc.stderr:
        print(proc.stderr, end="", file=sys.stderr)
    return proc


def transcript(out):
    match = re.search(r"--- transcript\n(.*?)--- end\n", out, re.S)
    if not match:
        sys.exit("FAIL: no transcript in the output")
    return match.group(1)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    game, max_p99 = sys.argv[1], sys.argv[2]
    if not os.path.exists(MODEL):
        print(f"skipped: {MODEL} is missing (scripts/fetch_model.sh)")
        return 77
    common = ["--headless", "--model", MODEL, "--seed", "7", "--rounds", str(ROUNDS),
              "--max-reply-tokens", "12", "--budget-ms", "2", "--max-p99-ms", max_p99,
              "--check-clock", "cpu", "--threads", "2"]
    failures = []

    # The transcript does not depend on the number of timed frames (the rest of the dialogue
    # runs off the clock), so the save/load runs below keep theirs short.
    first = run(game, common + ["--frames", str(TIMED_FRAMES)])
    text = transcript(first.stdout)
    lines = text.splitlines()
    if len(lines) != ROUNDS * NPCS:
        failures.append(f"expected {ROUNDS * NPCS} transcript lines, got {len(lines)}")
    if not any(re.match(r"\[\d\] [^:]+: \S", line) for line in lines):
        failures.append("every reply is empty")
    if first.returncode != 0:
        failures.append(f"budget check failed (exit {first.returncode}); see 'budget check'")

    with tempfile.TemporaryDirectory() as tmp:
        save_dir = os.path.join(tmp, "save")
        saved = run(game, common + ["--frames", "30", "--save", save_dir, "--save-frame", "3"])
        if transcript(saved.stdout) != text:
            failures.append("the run that saved at frame 3 gave another transcript than the first")
        if "saved game to" not in saved.stdout:
            failures.append("no save happened")
        loaded = run(game, common + ["--frames", "30", "--load", save_dir])
        match = re.search(r"loaded game from .* \(replies: ([\d ]+)\)", loaded.stdout)
        if not match:
            failures.append("the load did not report its replies")
        elif sum(int(n) for n in match.group(1).split()) >= ROUNDS * NPCS:
            failures.append("the save held the whole dialogue: nothing was left to continue")
        if transcript(loaded.stdout) != text:
            failures.append("the loaded game continued differently from the unsaved one")

    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("PASS: same dialogue on every run and after save/load; budget check passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
