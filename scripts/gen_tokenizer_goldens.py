#!/usr/bin/env python3
"""Generates tests/data/tokenizer/smollm2_goldens.json: token ids of SmolLM2-135M-Instruct's
tokenizer for a set of strings, from an independent implementation, for
tests/unit/tokenizer_golden_test.cc.

Reference: llama-cpp-python (llama.cpp's tokenizer) on the same GGUF, vocab_only, both with and
without special-token parsing; detokenize() of the ids is recorded as the decode golden.

Cross-check: the HF `tokenizers` package, rebuilt from the GGUF's vocab + merges as a BPE with
Digits(individual) + ByteLevel pre-tokenizers (SmolLM2's pipeline), must agree with llama.cpp on
every valid-UTF-8 string without special parsing; the script fails otherwise.

Invalid UTF-8: llama.cpp replaces each byte its UTF-8 decoder rejects with U+FFFD before the
pre-tokenizer (its decoder goes by the lead byte's bits: overlong forms and surrogates decode,
values above U+10FFFF make it throw, so no case has one). kiln does the same; for these cases the
ids are llama.cpp's, and `decode_special` (llama.cpp's detokenize) must equal the text as this
script replaces it on its own (llama_replace) and, where Python can hold the replaced text (no
surrogate), HF tokenizers must give the same ids for it.

SentencePiece (tests/data/tokenizer/spm_invalid_utf8_goldens.json): a small SPM vocabulary with
byte fallback (letters, a few merges, all 256 <0xXX> tokens; written into a vocab-only GGUF that
llama.cpp loads) and llama.cpp's ids for invalid UTF-8. llama.cpp's SPM tokenizer never replaces
bytes: it cuts the text into symbols of the length a lead byte announces, and whatever is not a
token becomes byte tokens. kiln keeps each byte that is not UTF-8 a symbol of its own instead, so
where an invalid lead byte is followed by other bytes (`kiln_differs`), llama.cpp turns those into
byte tokens too (an escaped space then decodes as "▁"); everywhere else the ids must be equal.
(Without byte tokens llama.cpp throws on such input, so there are no goldens for that case.)

Usage: python3 scripts/gen_tokenizer_goldens.py [model.gguf] [out.json] [spm_out.json]
"""
import json
import os
import sys

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
    ('invalid_ff_fe', b'abc\xff\xfedef'),
    ('invalid_lone_ff', b'abc\xffdef'),
    ('invalid_lone_continuation', b'lone \x80 byte'),
    ('invalid_stray_continuation', b'x\x80\x80y'),
    ('invalid_truncated_3byte', b'euro \xe2\x82 end'),
    ('invalid_overlong', b'\xc0\xaf slash'),
    ('invalid_overlong_3byte', b'a\xe0\x80\xafb \xf0\x80\x80\xaf'),
    ('invalid_surrogate', b'sur\xed\xa0\x80rogate'),
    ('invalid_mixed', b'ok \xf0\x9f\x98 \xfe!\xff? \xe4\xbd\xa0'),
    ('invalid_truncated_emoji_end', b'smile \xf0\x9f\x98'),
    ('invalid_lead_then_letters', b'\xe4abc \xc3'),
]

LONG_REPEAT = 200
LONG_SEPARATOR = b'  \n'

def llama_replace(b):
    """The bytes llama.cpp tokenizes for `b`: a lead byte announces 1 + (number of its leading
    one bits - 1) continuation bytes (10xxxxxx); a complete sequence is re-encoded from its code
    point (overlong forms shrink, surrogates stay), any other byte becomes U+FFFD."""
    out = bytearray()
    i = 0
    while i < len(b):
        b0 = b[i]
        n = 1 if b0 < 0x80 else 2 if 0xC0 <= b0 < 0xE0 else 3 if 0xE0 <= b0 < 0xF0 \
            else 4 if 0xF0 <= b0 < 0xF8 else 0
        tail = b[i + 1:i + n]
        if n and len(tail) == n - 1 and all(0x80 <= c < 0xC0 for c in tail):
            cp = b0 & (0x7F >> n) if n > 1 else b0
            for c in tail:
                cp = (cp << 6) | (c & 0x3F)
            assert cp <= 0x10FFFF, 'llama.cpp throws on this input; no golden possible'
            out += chr(cp).encode('utf-8', errors='surrogatepass')
            i += n
        else:
            out += '\ufffd'.encode('utf-8')
            i += 1
    return bytes(out)


# SPM vocabulary: (text, score, token type); 1 normal, 2 unknown, 3 control, 6 byte.
SPM_TOKENS = [('<unk>', 0.0, 2), ('<s>', 0.0, 3), ('</s>', 0.0, 3), ('\u2581', -5.0, 1)] + \
    [(c, -10.0, 1) for c in 'abcdef'] + \
    [('ab', -1.0, 1), ('\u2581a', -2.0, 1), ('de', -3.0, 1)] + \
    [(f'<0x{b:02X}>', 0.0, 6) for b in range(256)]

# (name, bytes, kiln_differs): see the docstring.
SPM_CASES = [
    ('valid', b'abc de fab', False),
    ('ff_fe', b'abc\xff\xfedef', True),            # 0xFF announces 4 bytes: FF FE d e
    ('lone_continuation', b'a\x80b', False),
    ('truncated_3byte_end', b'ab\xe2\x82', False),
    ('truncated_before_space', b'a\xe2 b', True),   # E2 announces 3 bytes: E2 + two of "▁"
    ('lead_then_letters', b'\xe4abc', True),
    ('overlong', b'\xc0\xaf', False),
    ('surrogate', b'a\xed\xa0\x80b', False),
    ('stray_then_valid', b'\x80\xc3\xa9', False),
]


def gen_spm(out_path):
    import tempfile

    import gguf
    import llama_cpp
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'spm_vocab.gguf')
        w = gguf.GGUFWriter(path, 'llama')
        w.add_tokenizer_model('llama')
        w.add_token_list([t for t, _, _ in SPM_TOKENS])
        w.add_token_scores([sc for _, sc, _ in SPM_TOKENS])
        w.add_token_types([ty for _, _, ty in SPM_TOKENS])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(False)
        w.add_add_space_prefix(True)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        cases = []
        for name, b, differs in SPM_CASES:
            ids = list(llm.tokenize(b, add_bos=False, special=False))
            cases.append({
                'name': name,
                'bytes': list(b),
                'llama_cpp_ids': ids,
                'llama_cpp_decoded': list(llm.detokenize(ids)),
                'kiln_differs': differs,
            })
    with open(out_path, 'w') as f:
        f.write('{\n')
        f.write(' "generator": "scripts/gen_tokenizer_goldens.py",\n')
        f.write(f' "reference": {json.dumps(f"llama-cpp-python {llama_cpp.__version__}")},\n')
        f.write(' "add_space_prefix": true, "bos": 1, "eos": 2, "unk": 0,\n')
        f.write(' "tokens": [\n')
        f.write(',\n'.join('  ' + json.dumps({'text': t, 'score': int(sc), 'type': ty}, ensure_ascii=True)
                           for t, sc, ty in SPM_TOKENS))
        f.write('\n ],\n "cases": [\n')
        f.write(',\n'.join('  ' + json.dumps(c, ensure_ascii=True) for c in cases))
        f.write('\n ]\n}\n')
    print(f'wrote {len(cases)} SPM cases to {out_path}')


def build_hf(tokens, merges):
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(' ', 1)) for m in merges])
    full = Tokenizer(bpe)
    full.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    full.decoder = decoders.ByteLevel()
    return full


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else MODEL
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), '..', 'tests', 'data', 'tokenizer', 'smollm2_goldens.json')
    reader = GGUFReader(model)
    tokens = reader.fields['tokenizer.ggml.tokens'].contents()
    merges = reader.fields['tokenizer.ggml.merges'].contents()
    hf_full = build_hf(tokens, merges)

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
        plain = lc_tok(b, False)
        special = lc_tok(b, True)
        replaced = llama_replace(b)
        decoded = bytes(llm.detokenize(special, special=True))
        if decoded != replaced:
            sys.exit(f'{name}: llama.cpp decodes {decoded!r}, the replacement rule gives {replaced!r}')
        try:
            text = replaced.decode('utf-8')
        except UnicodeDecodeError:  # a surrogate: Python (and HF tokenizers) cannot hold it
            text = None
        if text is not None and hf_full.encode(text).ids != plain:
            sys.exit(f'{name}: HF tokenizers {hf_full.encode(text).ids} != llama.cpp {plain}')
        cases.append({
            'name': name,
            'bytes': list(b),
            'ids': plain,
            'ids_parse_special': special,
            'decode_special': list(decoded),
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
    gen_spm(sys.argv[3] if len(sys.argv) > 3 else os.path.join(
        os.path.dirname(out_path), 'spm_invalid_utf8_goldens.json'))


if __name__ == '__main__':
    main()
