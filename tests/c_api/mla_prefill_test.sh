#!/usr/bin/env bash
# kiln_cache_params.mla_prefill through the C API and the `kiln` program, on a tiny deepseek2
# (MLA + MoE) model written by kiln-mkmodel, with a prompt of more than 128 tokens (one prefill
# chunk, long enough for the measured rule to decompress it):
#   - absorbed (the default) and measured give the same greedy tokens, and measured changes the
#     prompt's logits in their last bits (the decompressed form ran; kiln_logits_dump's hashes);
#   - `kiln generate --mla-prefill measured` prints absorbed's greedy text;
#   - `kiln generate --mla-prefill BAD` fails with exit status 2 and names the allowed values.
#   mla_prefill_test.sh KILN_MKMODEL KILN_LOGITS_DUMP KILN_CLI
set -euo pipefail
mkmodel="$1"
dump="$2"
kiln="$3"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mkmodel" --shape tiny-deepseek2-moe --type f32 --seed 16 --out "$tmp/ds2.gguf" >/dev/null
prompt=""
for _ in $(seq 30); do prompt+="the quick brown fox jumps "; done

"$dump" "$tmp/ds2.gguf" "$prompt" 4 kiln >"$tmp/absorbed" 2>/dev/null
"$dump" "$tmp/ds2.gguf" "$prompt" 4 mla-measured >"$tmp/measured" 2>/dev/null
tokens() { awk '{print $4}' "$1"; }
hashes() { awk '{print $6}' "$1"; }
if [[ "$(tokens "$tmp/absorbed")" != "$(tokens "$tmp/measured")" ]]; then
  echo "greedy tokens differ between absorbed and measured:" >&2
  paste "$tmp/absorbed" "$tmp/measured" >&2
  exit 1
fi
if [[ "$(hashes "$tmp/absorbed" | head -1)" == "$(hashes "$tmp/measured" | head -1)" ]]; then
  echo "measured: the prompt's logits are bitwise absorbed's (the decompressed form did not run)" >&2
  exit 1
fi

"$kiln" generate -m "$tmp/ds2.gguf" --raw -p "$prompt" --temp 0 -n 8 --threads 2 --quiet \
  >"$tmp/gen_absorbed"
"$kiln" generate -m "$tmp/ds2.gguf" --raw -p "$prompt" --temp 0 -n 8 --threads 2 --quiet \
  --mla-prefill measured >"$tmp/gen_measured"
if ! cmp -s "$tmp/gen_absorbed" "$tmp/gen_measured"; then
  echo "kiln generate --mla-prefill measured: '$(cat "$tmp/gen_measured")'," \
    "absorbed: '$(cat "$tmp/gen_absorbed")'" >&2
  exit 1
fi

status=0
"$kiln" generate -m "$tmp/ds2.gguf" -p hi -n 1 --quiet --mla-prefill fast >/dev/null \
  2>"$tmp/err" || status=$?
if [[ $status -ne 2 ]] || ! grep -q "absorbed or measured" "$tmp/err"; then
  echo "kiln generate --mla-prefill fast: exit $status, stderr '$(cat "$tmp/err")'" >&2
  exit 1
fi
echo "mla_prefill_test: ok ($(wc -l <"$tmp/absorbed") steps, same tokens, prompt logits differ)"
