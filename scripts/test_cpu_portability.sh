#!/usr/bin/env bash
# kiln on CPUs other than this one, under qemu-x86_64 (which raises SIGILL for any instruction the
# emulated CPU lacks): as a CPU without AVX-512 (Haswell: AVX2) and one without AVX2 (Nehalem:
# SSE4.2), each unless it is the host's own level (which ctest has just run natively),
# `kiln info` must name the level that CPU has, c_api_test must pass, and a short greedy
# `kiln generate` and kiln_logits_dump (per-step hashes of every logit) must equal the native
# run's bit for bit, and c_session_test must pass: as Haswell every test that runs kernels (not
# cancel, cache-full or saved-state: they add time, no kernel), with the native run's model output;
# as Nehalem its NULL-handle tests only (emulating the scalar level costs ~1000x native: its
# `generate` alone takes ~110 s and runs the kernels kiln generate and the logits dump check there;
# `speculative` ~400 s; the suite's time budget needs those minutes; KILN_PORTABILITY_FULL=1 runs
# every test at both, ~25 CPU minutes). Then a short
# `kiln generate` under valgrind memcheck: no errors, nothing definitely lost.
# Usage: scripts/test_cpu_portability.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
kiln="$build/tools/kiln/kiln"
dump="$build/tests/c_api/kiln_logits_dump"
session_test="$build/tests/c_api/c_session_test"
api_test="$build/tests/c_api/c_api_test"
model="${KILN_MODEL_DIR:-$HOME/.cache/kiln}/SmolLM2-135M-Instruct.Q4_1.gguf"
for f in "$kiln" "$dump" "$session_test" "$api_test" "$model"; do
  [[ -e "$f" ]] || { echo "test_cpu_portability: missing $f" >&2; exit 1; }
done
command -v qemu-x86_64 >/dev/null || { echo "test_cpu_portability: qemu-x86_64 missing (apt: qemu-user)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "test_cpu_portability: valgrind missing" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Short runs: qemu emulates 10-50x slower than native, the scalar level is slower still. --raw:
# the chat template would make the prompt 35 tokens, half a minute of prefill at the scalar level.
prompt="The capital of France is"
generate=(generate -m "$model" --temp 0 -n 16 --threads 2 --quiet --raw -p "$prompt")
dump_args=("$model" "$prompt" 3)

seconds() { date +%s%N; }
elapsed() { local ms=$((($(seconds) - $1) / 1000000)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
# The level `kiln info` names: its "cpu kernels: LEVEL (...)" line or its backends section's
# "cpu: LEVEL kernels (...)" line.
level_of() {
  sed -n 's/^cpu kernels: *\([a-z0-9]*\).*/\1/p; s/^  cpu: \([a-z0-9]*\) kernels.*/\1/p' | head -n 1
}

# The lines of c_session_test that are the model's output (the rest varies with timing).
model_output() { grep -E '^(greedy|n-gram|prefix cache):' || true; }

"$kiln" "${generate[@]}" >"$tmp/text.native" 2>/dev/null
"$session_test" 2>&1 | model_output >"$tmp/session.native"
"$dump" "${dump_args[@]}" >"$tmp/logits.native" 2>/dev/null
native_level=$("$kiln" info "$model" | level_of)
echo "native ($native_level): $(cat "$tmp/text.native")"

fail=0
# CPU model -> the level kiln must pick there.
for cpu in Haswell:avx2 Nehalem:scalar; do
  name=${cpu%%:*}
  want=${cpu##*:}
  # A host whose own level is this one (an AVX2 machine without AVX-512) has just run the whole
  # ctest suite at it natively; emulating it again would only add minutes (Haswell: ~640 s there).
  if [[ "$want" == "$native_level" ]]; then
    echo "qemu -cpu $name ($want): skipped, this host's own level (ctest ran it natively)"
    continue
  fi
  start=$(seconds)
  run=(qemu-x86_64 -cpu "$name")
  got=$("${run[@]}" "$kiln" info "$model" 2>/dev/null | level_of)
  if [[ "$got" != "$want" ]]; then
    echo "qemu $name: kiln chose '$got', expected '$want'" >&2
    fail=1
  fi
  # Each entry a command line: the test program and its arguments.
  tests=("$api_test" "$session_test")
  if [[ "${KILN_PORTABILITY_FULL:-0}" != 1 ]]; then
    if [[ $name == Haswell ]]; then
      tests[1]="$session_test null_handles generate llama_cpp_order speculative \
sampler_and_logprobs prefix_cache"
    else
      tests[1]="$session_test null_handles"
    fi
  fi
  for test in "${tests[@]}"; do
    # shellcheck disable=SC2086  # split the entry into program and arguments
    log="$tmp/test.$name.$(basename "${test%% *}")"
    if ! "${run[@]}" $test >"$log" 2>&1; then
      echo "qemu $name: $test failed:" >&2
      grep -v "TCG doesn't support" "$log" | tail -20 >&2
      fail=1
    fi
  done
  # The session test's greedy text and counts, where the tests run here print them (all but
  # null_handles do).
  model_output <"$tmp/test.$name.c_session_test" >"$tmp/session.$name"
  if { [[ ! -s "$tmp/session.$name" ]] && [[ "${tests[1]}" != "$session_test null_handles" ]]; } ||
    [[ -n "$(comm -23 <(sort "$tmp/session.$name") <(sort "$tmp/session.native"))" ]]; then
    echo "qemu $name: c_session_test's output differs from the native run:" >&2
    diff "$tmp/session.native" "$tmp/session.$name" >&2 || true
    fail=1
  fi
  "${run[@]}" "$kiln" "${generate[@]}" >"$tmp/text.$name" 2>"$tmp/err.$name" ||
    { echo "qemu $name: kiln generate failed:" >&2; tail -5 "$tmp/err.$name" >&2; fail=1; }
  "${run[@]}" "$dump" "${dump_args[@]}" >"$tmp/logits.$name" 2>"$tmp/err.$name" ||
    { echo "qemu $name: kiln_logits_dump failed:" >&2; tail -5 "$tmp/err.$name" >&2; fail=1; }
  for what in text logits; do
    if ! cmp -s "$tmp/$what.native" "$tmp/$what.$name"; then
      echo "qemu $name: $what differs from the native run:" >&2
      diff "$tmp/$what.native" "$tmp/$what.$name" >&2 || true
      fail=1
    fi
  done
  echo "qemu -cpu $name ($got): $(for t in "${tests[@]}"; do basename "${t%% *}"; done | tr '\n' ' ')generate, logits: $(elapsed "$start") s"
done

start=$(seconds)
if ! valgrind --tool=memcheck --error-exitcode=1 --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite \
    "$kiln" generate -m "$model" --temp 0 -n 4 --threads 2 --quiet --raw -p "$prompt" \
    >"$tmp/text.valgrind" 2>"$tmp/valgrind.log"; then
  echo "valgrind: errors or definite leaks:" >&2
  tail -40 "$tmp/valgrind.log" >&2
  fail=1
fi
grep -E "ERROR SUMMARY|definitely lost|no leaks are possible" "$tmp/valgrind.log" |
  sed 's/^==[0-9]*== */valgrind: /'
# The first 4 tokens of the native 16-token text (valgrind runs the AVX2 level).
if [[ "$(cat "$tmp/text.native")" != "$(cat "$tmp/text.valgrind")"* ]]; then
  echo "valgrind: text '$(cat "$tmp/text.valgrind")' does not begin the native text" >&2
  fail=1
fi
echo "valgrind memcheck: generate 4 tokens in $(elapsed "$start") s"
[[ $fail == 0 ]] && echo "test_cpu_portability: all passed"
exit $fail
