#!/usr/bin/env python3
"""Generates tests/data/tokenizer/smollm2_goldens.json: token ids of SmolLM2-135M-Instruct's
tokenizer for a set of strings, from an independent implementation, for
tests/unit/tokenizer_golden_test.cc.

Reference: llama-cpp-python (llama.cpp's tokenizer) on the same GGUF, vocab_only, both with and
without special-token parsing; detokenize() of the ids is recorded as the decode golden.

Cross-check: the HF `tokenizers` package, rebuilt from the GGUF's vocab + merges as a BPE with
Digits(individual) + ByteLevel pre-tokenizers (SmolLM2's pipeline), must agree with llama.cpp on
every valid-UTF-8 string without special parsing; the script fails otherwise.

Invalid UTF-8: llama.cpp replaces each invalid byte with U+FFFD before tokenizing (so its ids do
not decode to the input). kiln instead keeps each invalid byte as its own unit (a symbol-class
code point for the pre-tokenizer) and BPE-encodes the raw byte. For these cases `ids` is computed
independently of kiln: Python's `regex` module splits the surrogateescape-decoded text (each
invalid byte becomes a lone surrogate, category Cs, matching [^\\s\\p{L}\\p{N}] like U+FFFD)
with SmolLM2's two patterns, and HF `tokenizers` BPE encodes each byte-level-mapped word
(is_pretokenized); a byte that has no token is dropped but still separates its neighbours (as in
llama.cpp's merge loop). `llama_cpp_ids` keeps llama.cpp's answer, which must equal kiln's encoding of
the text with every invalid byte replaced by U+FFFD (`fffd_text`).

Usage: python3 scripts/gen_tokenizer_goldens.py [model.gguf] [out.json]
"""
import json
import os
import sys

import regex
from gguf import GGUFReader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

MODEL = os.path.expanduser(
    os.environ.get('KILN_MODEL_DIR', '~/.cache/kiln') + '/SmolLM2-135M-Instruct.Q4_1.gguf')

CASES = [
    ('english', 'Hello world! This is a simple English sentence.'),
    ('empty', ''),
    ('single_char', 'a'),
    ('single_space', ' '),
    ('leading_space', ' leading space'),
    ('trailing_spaces', 'trailing spaces   '),
    ('whitespace_run', 'a     b'),
    ('whitespace_only', '    \t\t  \n  '),
    ('tabs', '\tindented\twith\ttabs\t\t'),
    ('newlines', 'line one\nline two\n\nline four\n\n\n'),
    ('crlf', 'windows\r\nline\r\nendings\r\n'),
    ('mixed_ws', ' \n \t\r\n x  \n'),
    ('code_python', 'def add(a, b):\n    return a + b  # sum\n\nprint(add(1, 2))\n'),
    ('code_cpp', 'for (int i = 0; i < n; ++i) {\n\tv[i] *= 2;\n}'),
    ('code_json', '{"key": [1, 2.5, -3e10], "nested": {"x": null}}'),
    ('numbers_short', '1 22 333 4444'),
    ('numbers_long', '3141592653589793238462643383279502884197169399375105820974944'),
    ('numbers_mixed', 'v1.2.3 costs $1,234.56 (or 99%) at 10:45pm on 2024-01-31'),
    ('punctuation', 'Wait... what?! (Really) -- "yes"; [ok] {fine} <tag> @home #1 & ~x^y|z'),
    ('contractions', "It's, don't, we're, I've, I'm, you'll, he'd"),
    ('contractions_upper', "IT'S DON'T WE'RE I'VE"),
    ('apostrophes', "'s 't 're 'x ' ''"),
    ('cjk_chinese', '你好，世界！我们今天学习分词。'),
    ('cjk_japanese', 'こんにちは世界。カタカナとひらがな。'),
    ('cjk_korean', '안녕하세요 세계'),
    ('emoji', 'I love 🍕 and 🎉🎉!'),
    ('emoji_zwj', 'family: 👨‍👩‍👧‍👦 flag: 🏳️‍🌈 skin: 👍🏽'),
    ('accented', 'café naïve résumé Ångström façade'),
    ('combining', 'e\u0301 a\u0308 n\u0303 (decomposed)'),
    ('arabic', 'مرحبا بالعالم'),
    ('hindi', 'नमस्ते दुनिया'),
    ('greek_cyrillic', 'Αλφάβητο и кириллица'),
    ('unicode_digits', 'Arabic-Indic ٣٤٥ fullwidth １２３ superscript ²³'),
    ('nbsp_and_ideographic_space', 'a\u00a0b\u3000c\u2009d'),
    ('control_chars', 'bell\x07 nul\x00 esc\x1b[0m del\x7f'),
    ('url', 'https://example.com/path?query=1&b=two#frag'),
    ('mixed_script', 'The word 東京 (Tokyo) has 2 kanji.'),
    ('long_word', 'Supercalifragilisticexpialidocious' * 8),
    ('repeated_chars', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'),
    ('special_im_start', '<|im_start|>user\nHi there<|im_end|>\n'),
    ('special_chat', '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n'),
    ('special_endoftext', 'text<|endoftext|>more'),
    ('special_partial', '<|im_start|<|im_end|><|im_end'),
    ('special_adjacent', '<|im_end|><|im_end|><repo_name>x<file_sep>'),
    ('special_in_word', 'abc<|im_start|>def'),
]

# Invalid UTF-8 (bytes).
INVALID_CASES = [
    ('invalid_lone_ff', b'abc\xffdef'),
    ('invalid_stray_continuation', b'x\x80\x80y'),
    ('invalid_truncated_3byte', b'euro \xe2\x82 end'),
    ('invalid_overlong', b'\xc0\xaf slash'),
    ('invalid_surrogate', b'sur\xed\xa0\x80rogate'),
    ('invalid_mixed', b'ok \xf0\x9f\x98 \xfe!\xff? \xe4\xbd\xa0'),
    ('invalid_truncated_emoji_end', b'smile \xf0\x9f\x98'),
    ('invalid_lead_then_letters', b'\xe4abc \xc3'),
]

LONG_REPEAT = 200
LONG_SEPARATOR = b'  \n'

SMOLLM_PATTERNS = [
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
]


def bytes_to_unicode():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def regex_split(text, patterns):
    """Applies the patterns in sequence; matches and gaps both become fragments."""
    frags = [text]
    for pat in patterns:
        out = []
        for f in frags:
            last = 0
            for m in regex.finditer(pat, f):
                if m.start() > last:
                    out.append(f[last:m.start()])
                out.append(m.group())
                last = m.end()
            if last < len(f):
                out.append(f[last:])
        frags = out
    return frags


def build_hf(tokens, merges):
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(' ', 1)) for m in merges])
    full = Tokenizer(bpe)
    full.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    full.decoder = decoders.ByteLevel()
    bare = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(' ', 1)) for m in merges]))
    return full, bare


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else MODEL
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), '..', 'tests', 'data', 'tokenizer', 'smollm2_goldens.json')
    reader = GGUFReader(model)
    tokens = reader.fields['tokenizer.ggml.tokens'].contents()
    merges = reader.fields['tokenizer.ggml.merges'].contents()
    hf_full, hf_bare = build_hf(tokens, merges)
    u2b = {c: bt for bt, c in B2U.items()}
    global U2B_TOKEN
    U2B_TOKEN = [bytes(u2b.get(ch, 0) for ch in t) for t in tokens]
    global UNTOKENIZABLE
    token_set = set(tokens)
    UNTOKENIZABLE = [B2U[b] for b in range(256) if B2U[b] not in token_set]

    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)

    def lc_tok(b, special):
        return list(llm.tokenize(b, add_bos=False, special=special))

    cases = []
    for name, text in CASES:
        b = text.encode('utf-8')
        plain = lc_tok(b, False)
        special = lc_tok(b, True)
        hf = hf_full.encode(text).ids if text else []
        if hf != plain:
            sys.exit(f'{name}: HF tokenizers {hf} != llama.cpp {plain}')
        decoded = llm.detokenize(special, special=True)
        cases.append({
            'name': name,
            'bytes': list(b),
            'text': text,
            'ids': plain,
            'ids_parse_special': special,
            'decode_special': list(decoded),
        })
    for name, b in INVALID_CASES:
        text = b.decode('utf-8', errors='surrogateescape')
        words = regex_split(text, SMOLLM_PATTERNS)
        mapped = [''.join(B2U[x] for x in w.encode('utf-8', errors='surrogateescape'))
                  for w in words]
        # A byte with no token (0xFE, 0xFF, ... in this vocab) is dropped but still separates
        # its neighbours (llama.cpp keeps it as a symbol that never merges; HF would skip it
        # before merging), so split words around such bytes first.
        parts = []
        for w in mapped:
            parts += [p for p in regex.split('|'.join(map(regex.escape, UNTOKENIZABLE)), w) if p] \
                if UNTOKENIZABLE else [w]
        expected = hf_bare.encode(parts, is_pretokenized=True).ids if parts else []
        # Each invalid byte -> U+FFFD, as llama.cpp does for bytes its (lenient) decoder rejects.
        fffd = regex.sub(r'[\udc80-\udcff]', '\ufffd', text)
        fffd_ok = hf_full.encode(fffd).ids == lc_tok(b, False)
        roundtrip = b''.join(U2B_TOKEN[i] for i in expected) == b
        cases.append({
            'name': name,
            'bytes': list(b),
            'ids': expected,
            'ids_parse_special': expected,
            'llama_cpp_ids': lc_tok(b, False),
            # Only where llama.cpp's decoder rejects the same bytes (it accepts overlong and
            # surrogate forms), so the FFFD relation holds; else null.
            'fffd_text': list(fffd.encode('utf-8')) if fffd_ok else None,
            # False when some byte has no token in the vocab (llama.cpp and kiln drop it).
            'roundtrip': roundtrip,
            'invalid_utf8': True,
        })
    # A long text (several pre-tokenizer chunks in kiln) checked by count and FNV-1a hash of the
    # ids: every valid case's text followed by LONG_SEPARATOR ("  \n": a whitespace run ending in
    # a newline, where a chunk must not be cut), all repeated LONG_REPEAT times.
    long_text = b''.join(bytes(c['bytes']) + LONG_SEPARATOR for c in cases
                         if not c.get('invalid_utf8')) * LONG_REPEAT
    long_ids = lc_tok(long_text, False)
    h = 0xcbf29ce484222325
    for i in long_ids:
        for k in range(4):
            h = ((h ^ ((i >> (8 * k)) & 0xFF)) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    header = {
        'model': os.path.basename(model),
        'generator': 'scripts/gen_tokenizer_goldens.py',
        'reference': f'llama-cpp-python {llama_cpp.__version__} (tokenize add_bos=False)',
        'long_repeat': LONG_REPEAT,
        'long_separator': LONG_SEPARATOR.decode(),
        'long_bytes': len(long_text),
        'long_n_ids': len(long_ids),
        'long_fnv1a64_hex': f'{h:016x}',
    }
    with open(out_path, 'w') as f:  # one case per line: readable diffs
        f.write('{\n')
        for k, v in header.items():
            f.write(f' {json.dumps(k)}: {json.dumps(v)},\n')
        f.write(' "cases": [\n')
        f.write(',\n'.join('  ' + json.dumps(c, ensure_ascii=True) for c in cases))
        f.write('\n ]\n}\n')
    print(f'wrote {len(cases)} cases to {out_path}')


if __name__ == '__main__':
    main()
