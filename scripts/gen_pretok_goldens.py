#!/usr/bin/env python3
"""Generates tests/data/tokenizer/pretok_splits.json: the words each byte-level BPE pre-tokenizer
splits a set of texts into, for tests/unit/tokenizer_pretok_test.cc.

Reference: Python's `regex` module (it knows \\p{L}, \\p{N}, \\p{P}) applying each pre-tokenizer's
regex list the way llama.cpp applies it, independently of kiln's hand-written scanners
(lib/tokenizer/pre_tokenizer.cc): the passes run in order, each pass re-splits every fragment of
the previous one, and both the matches and the gaps between them become fragments (empty ones
are dropped).

The regex lists are the ones lib/tokenizer/pre_tokenizer.cc implements (llama.cpp's lists for
each tokenizer.ggml.pre; Llama-3's contractions are case-insensitive, written out as [sS] etc.).
Keys in the output are tokenizer.ggml.pre names.

Usage: python3 scripts/gen_pretok_goldens.py [out.json]   (needs pip install regex)
"""
import json
import os
import sys

import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3 and Qwen 2 differ only in how many digits one number word may hold.
LLAMA3_TEMPLATE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                   r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}DIGITS| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+")

PRE_TOKENIZERS = {
    'default': [r'[\p{P}\$\+<=>\^~\|]+', GPT2, r'\p{N}+', r'[0-9][0-9][0-9]'],
    'gpt2': [GPT2],
    'smollm': [r'\p{N}', GPT2],
    'llama3': [LLAMA3_TEMPLATE.replace('DIGITS', '{1,3}')],
    'qwen2': [LLAMA3_TEMPLATE.replace('DIGITS', '')],
}

# Each text stresses a different rule: contractions (case), digit grouping, whitespace runs
# before words and at the end, \r\n handling, symbols next to words, non-ASCII letters and
# digits (Arabic-Indic, superscript), and non-ASCII whitespace (U+00A0, U+3000).
TEXTS = [
    'Hello world',
    "it's 12345 apples",
    'a   b\n\n  c',
    "I'M HERE'S\tx",
    '  (hi)!!\n\nok\r\n  end  ',
    'x=1234567;',
    '\u00fcber \u6771\u4eac \u0663\u0664\u0665',
    ' ?!\n\n  x',
    "don't  stop\t\t\n",
    '$5+3<=8 ~a|b^c',
    '\u0661\u0662\u0663\u0664 \u00b2x',
    'a\u00a0b\u3000c',
]


def split_pass(pattern, fragments):
    out = []
    for frag in fragments:
        prev_end = 0
        for m in pattern.finditer(frag):
            if m.start() > prev_end:
                out.append(frag[prev_end:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            prev_end = m.end()
        if len(frag) > prev_end:
            out.append(frag[prev_end:])
    return out


def split(pre, text):
    fragments = [text] if text else []
    for expr in PRE_TOKENIZERS[pre]:
        fragments = split_pass(regex.compile(expr), fragments)
    assert ''.join(fragments) == text, (pre, text)
    return fragments


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, '..', 'tests', 'data', 'tokenizer', 'pretok_splits.json')
    cases = [{'text': t, 'words': {pre: split(pre, t) for pre in PRE_TOKENIZERS}} for t in TEXTS]
    with open(out_path, 'w', encoding='ascii') as f:
        f.write('{\n "generator": "scripts/gen_pretok_goldens.py",\n')
        f.write(f' "reference": {json.dumps("regex " + regex.__version__)},\n')
        f.write(' "cases": [\n')
        f.write(',\n'.join('  ' + json.dumps(c, ensure_ascii=True) for c in cases))
        f.write('\n ]\n}\n')
    print(f'wrote {len(cases)} texts x {len(PRE_TOKENIZERS)} pre-tokenizers to {out_path}')


if __name__ == '__main__':
    main()
