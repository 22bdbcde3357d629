#!/usr/bin/env bash
# Smoke test of the `kiln` program's generation subcommands on the default model:
#   generate --quiet --temp 0: stdout is exactly the greedy answer, stats only on stderr; the
#     same answer split over two runs by --save-state / --load-state; a file that is not a
#     state refused with the reason;
#   chat: two scripted turns, the second reusing the first turn's tokens;
#   generate --strategy eagle:HEAD --typical-acceptance: at --temp 0 the greedy answer; sampled,
#     the lossy acceptances reported; the flag refused without a head strategy;
#   generate --cache-type q8_0: an answer, the same over --save-state / --load-state; a bad type
#     refused with the allowed ones;
#   perplexity: the last line is "perplexity: <finite value>" (f16 and q8_0 caches);
#   info: the summary and the backends for the default model; for a valid GGUF of an
#         architecture kiln cannot run, its metadata and what is missing;
# and on a random-weight qwen2 model written by kiln-mkmodel:
#   info: names the architecture;
#   generate --raw --temp 0 --llama-cpp-order: stdout is llama.cpp's greedy text for that file
#   (scripts/gen_arch_goldens.py --cli-text).
# KILN_TEST_EMULATOR (set by CMake for a cross build: wine for the Windows one) runs both programs;
# their \r\n line ends are cut to \n there so that every comparison stays exact.
set -Eeuo pipefail
kiln_program="$1"
src="$2"
mkmodel_program="$3"
read -r -a emulator <<<"${KILN_TEST_EMULATOR:-}"
kiln() { "${emulator[@]}" "$kiln_program" "$@" | tr -d '\r'; }
mkmodel() { "${emulator[@]}" "$mkmodel_program" "$@" | tr -d '\r'; }
model="${KILN_MODEL_DIR:-$HOME/.cache/kiln}/SmolLM2-135M-Instruct.Q4_1.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A command that fails stops the test (set -e): say which, with the programs' captured stderr,
# before the files go (a Windows run under wine once failed in 0.02 s and left nothing to read).
# The trap runs where the failing command's stderr may be redirected: it writes to fd 3.
exec 3>&2
trap 'echo "kiln_cli_test: line $LINENO failed (exit $?)" >&3
      for f in "$tmp"/*err*; do [[ -f "$f" ]] && { echo "--- $f:" >&3; cat "$f" >&3; }; done' ERR

kiln generate -m "$model" --temp 0 -n 32 --threads 2 --quiet \
  -p "What is the capital of France? Answer in one sentence." >"$tmp/out" 2>"$tmp/err"
expected="The capital of France is Paris."
if [[ "$(cat "$tmp/out")" != "$expected" ]]; then
  echo "generate: stdout was '$(cat "$tmp/out")', expected '$expected'" >&2
  exit 1
fi
grep -q "generated: .* tok/s" "$tmp/err" || { echo "generate: no stats on stderr" >&2; exit 1; }

# The same answer in two runs: 4 tokens saved with --save-state, the rest after --load-state.
kiln generate -m "$model" --temp 0 -n 4 --threads 2 --quiet --save-state "$tmp/state" \
  -p "What is the capital of France? Answer in one sentence." >"$tmp/out1" 2>"$tmp/err1"
kiln generate -m "$model" --temp 0 -n 28 --threads 2 --quiet --load-state "$tmp/state" \
  >"$tmp/out2" 2>"$tmp/err2"
resumed="$(cat "$tmp/out1")$(cat "$tmp/out2")"
if [[ "$resumed" != "$expected" ]]; then
  echo "generate --save-state/--load-state: stdout was '$resumed', expected '$expected'" >&2
  cat "$tmp/err1" "$tmp/err2" >&2
  exit 1
fi
if kiln generate -m "$model" --load-state "$src/README.md" -n 4 --quiet >/dev/null \
  2>"$tmp/err3"; then
  echo "generate --load-state README.md: succeeded" >&2
  exit 1
fi
grep -q "session state" "$tmp/err3" || { echo "generate --load-state: no reason given" >&2; exit 1; }

# Typical acceptance (lossy) with the committed EAGLE head: greedy verification at --temp 0 (the
# plain answer); when sampling, stderr reports what the lossy rule accepted.
eagle="$src/models/SmolLM2-135M-Instruct.eagle.gguf"
kiln generate -m "$model" --temp 0 -n 32 --threads 2 --quiet --strategy "eagle:$eagle" \
  --typical-acceptance -p "What is the capital of France? Answer in one sentence." \
  >"$tmp/typical0" 2>"$tmp/typical0_err"
if [[ "$(cat "$tmp/typical0")" != "$expected" ]]; then
  echo "generate --typical-acceptance --temp 0: stdout was '$(cat "$tmp/typical0")'" >&2
  exit 1
fi
kiln generate -m "$model" --temp 0.8 --seed 3 -n 24 --threads 2 --strategy "eagle:$eagle" \
  --typical-acceptance -p "What should I pack for a weekend of hiking?" >/dev/null \
  2>"$tmp/typical_err"
grep -q "accepted by the lossy typical acceptance" "$tmp/typical_err" ||
  { echo "generate --typical-acceptance: '$(cat "$tmp/typical_err")'" >&2; exit 1; }
# The committed EAGLE-3 head through --strategy eagle:PATH: the plain greedy answer, and the
# head drafted (stderr's speculative line).
eagle3="$src/models/SmolLM2-135M-Instruct.eagle3.gguf"
kiln generate -m "$model" --temp 0 -n 32 --threads 2 --quiet --strategy "eagle:$eagle3" \
  -p "What is the capital of France? Answer in one sentence." >"$tmp/eagle3" 2>"$tmp/eagle3_err"
if [[ "$(cat "$tmp/eagle3")" != "$expected" ]]; then
  echo "generate --strategy eagle:eagle3: stdout was '$(cat "$tmp/eagle3")'" >&2
  exit 1
fi
grep -q "speculative (eagle:.*eagle3.gguf): drafted [1-9]" "$tmp/eagle3_err" ||
  { echo "generate --strategy eagle:eagle3: '$(cat "$tmp/eagle3_err")'" >&2; exit 1; }
if kiln generate -m "$model" --strategy ngram --typical-acceptance -p hi -n 1 >/dev/null \
  2>"$tmp/typical_bad"; then
  echo "generate --strategy ngram --typical-acceptance: succeeded" >&2
  exit 1
fi
grep -q "needs --strategy medusa:PATH or eagle:PATH" "$tmp/typical_bad" ||
  { echo "generate --typical-acceptance misuse: '$(cat "$tmp/typical_bad")'" >&2; exit 1; }

# A q8_0 K/V cache (--cache-type): a greedy answer, the same when split over two runs by
# --save-state / --load-state (the state holds the q8_0 rows); an unknown type refused.
kiln generate -m "$model" --temp 0 -n 24 --threads 2 --quiet --cache-type q8_0 \
  -p "What is the capital of France? Answer in one sentence." >"$tmp/q8" 2>/dev/null
[[ -s "$tmp/q8" ]] || { echo "generate --cache-type q8_0: no output" >&2; exit 1; }
kiln generate -m "$model" --temp 0 -n 4 --threads 2 --quiet --cache-type q8_0 \
  --save-state "$tmp/q8state" -p "What is the capital of France? Answer in one sentence." \
  >"$tmp/q8_1" 2>/dev/null
kiln generate -m "$model" --temp 0 -n 20 --threads 2 --quiet --cache-type q8_0 \
  --load-state "$tmp/q8state" >"$tmp/q8_2" 2>/dev/null
if [[ "$(cat "$tmp/q8_1")$(cat "$tmp/q8_2")" != "$(cat "$tmp/q8")" ]]; then
  echo "generate --cache-type q8_0 over two runs: '$(cat "$tmp/q8_1")$(cat "$tmp/q8_2")'," \
    "in one: '$(cat "$tmp/q8")'" >&2
  exit 1
fi
if kiln generate -m "$model" --cache-type q4 -p hi -n 1 --quiet >/dev/null 2>"$tmp/err4"; then
  echo "generate --cache-type q4: succeeded" >&2
  exit 1
fi
grep -q "bad value 'q4' for --cache-type (f16, f32, bf16 or q8_0)" "$tmp/err4" ||
  { echo "generate --cache-type q4: '$(cat "$tmp/err4")'" >&2; exit 1; }

printf 'Hi!\nAnd again?\n/exit\n' | kiln chat -m "$model" --temp 0 -n 16 --threads 2 \
  >"$tmp/chat" 2>"$tmp/chat_err"
[[ $(grep -c "tok/s" "$tmp/chat_err") == 2 ]] || { echo "chat: expected 2 stats lines" >&2; exit 1; }
grep -q "reused), " "$tmp/chat_err"
if grep -q "(0 reused)" <(sed -n 2p "$tmp/chat_err"); then
  echo "chat: the second turn reused nothing" >&2
  exit 1
fi

for cache_type in f16 q8_0; do
  kiln perplexity -m "$model" -f "$src/README.md" --ctx 128 --chunks 2 --threads 2 \
    --cache-type "$cache_type" >"$tmp/ppl" 2>/dev/null
  last=$(tail -n 1 "$tmp/ppl")
  if ! [[ "$last" =~ ^perplexity:\ [0-9]+\.[0-9]+$ ]]; then
    echo "perplexity --cache-type $cache_type: last line was '$last'" >&2
    exit 1
  fi
done
kiln info "$model" >"$tmp/info"
for want in "architecture: llama" "general.architecture" "backends:" "  cpu: "; do
  grep -q "$want" "$tmp/info" || { echo "info: no '$want' in its output" >&2; exit 1; }
done
# A tiny llama file renamed to an architecture kiln does not know ("gemma": every "llama" in the
# file, the key prefixes included, has the same length, so the file stays valid).
mkmodel --shape tiny-llama-gqa --type f32 --out "$tmp/tiny.gguf" >/dev/null 2>&1
python3 -c "import sys; d=open(sys.argv[1],'rb').read(); open(sys.argv[2],'wb').write(d.replace(b'llama', b'gemma'))" \
  "$tmp/tiny.gguf" "$tmp/gemma.gguf"
kiln info "$tmp/gemma.gguf" >"$tmp/info2"
for want in "runnable:     no" "architecture 'gemma' is not supported" "gemma.block_count" "backends:"; do
  grep -q "$want" "$tmp/info2" || { echo "info (unknown architecture): no '$want'" >&2; cat "$tmp/info2" >&2; exit 1; }
done
mkmodel --shape tiny-qwen2-untied --type f16 --seed 1 --out "$tmp/qwen2.gguf" >/dev/null
kiln info "$tmp/qwen2.gguf" >"$tmp/info3"
grep -q "^architecture: qwen2$" "$tmp/info3" || { echo "info: no 'architecture: qwen2'" >&2; exit 1; }
kiln generate -m "$tmp/qwen2.gguf" --raw --temp 0 -n 15 --threads 2 --quiet --llama-cpp-order \
  -p "The capital of France is" >"$tmp/qwen2_out" 2>/dev/null
expected="ackherherherherherherherirlillherherherherher"
if [[ "$(cat "$tmp/qwen2_out")" != "$expected" ]]; then
  echo "qwen2 generate: stdout was '$(cat "$tmp/qwen2_out")', expected '$expected'" >&2
  exit 1
fi
echo "kiln_cli_test: ok ($last; qwen2 generate as llama.cpp)"
