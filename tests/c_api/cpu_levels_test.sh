#!/usr/bin/env bash
# Every CPU level this machine runs gives the same results: kiln_logits_dump's per-step logits
# hashes (a prompt, then greedy tokens fed back one at a time) in kiln's order and in llama.cpp's,
# and `kiln generate`'s greedy text, at KILN_CPU_LEVEL=scalar, =avx2 and the native level, are
# identical; `kiln info` names the level each run used.
set -euo pipefail
dump="$1"
kiln="$2"
model="${KILN_MODEL_DIR:-$HOME/.cache/kiln}/SmolLM2-135M-Instruct.Q4_1.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt="The old lighthouse keeper looked at the sea and said"

native=$("$kiln" info "$model" | sed -n 's/^cpu kernels: *\([a-z0-9]*\).*/\1/p')
case "$native" in
  avx512) levels="scalar avx2 native" ;;
  avx2) levels="scalar native" ;;
  scalar) levels="native" ;;
  *) echo "kiln info printed no cpu kernels line" >&2; exit 1 ;;
esac
for level in $levels; do
  env_level=()
  [[ $level != native ]] && env_level=(KILN_CPU_LEVEL=$level)
  want=$level
  [[ $level == native ]] && want=$native
  got=$(env "${env_level[@]}" "$kiln" info "$model" | sed -n 's/^cpu kernels: *\([a-z0-9]*\).*/\1/p')
  if [[ "$got" != "$want" ]]; then
    echo "KILN_CPU_LEVEL=$level: kiln info says '$got', expected '$want'" >&2
    exit 1
  fi
  for order in kiln llama.cpp; do
    env "${env_level[@]}" "$dump" "$model" "$prompt" 6 $order >"$tmp/$order.$level" 2>/dev/null
  done
  env "${env_level[@]}" "$kiln" generate -m "$model" --temp 0 -n 24 --threads 2 --quiet \
    -p "Write a short story about a robot learning to paint." >"$tmp/text.$level" 2>/dev/null
done
for level in $levels; do
  for what in kiln llama.cpp text; do
    if ! cmp -s "$tmp/$what.native" "$tmp/$what.$level"; then
      echo "$what: KILN_CPU_LEVEL=$level differs from the native level ($native):" >&2
      diff "$tmp/$what.native" "$tmp/$what.$level" >&2 || true
      exit 1
    fi
  done
done
[[ $(wc -l <"$tmp/kiln.native") == 7 ]] || { echo "kiln_logits_dump printed no steps" >&2; exit 1; }
echo "cpu_levels_test: levels [$levels] agree (native: $native): $(cat "$tmp/text.native")"
