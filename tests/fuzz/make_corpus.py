#!/usr/bin/env python3
"""Generates the seed corpus of tests/fuzz/gguf_reader_fuzz.cc with gguf-py (an independent GGUF
writer), so the seeds double as a cross-check of kiln's reader against another implementation
(tests/unit/gguf_fuzz_corpus_test.cc parses every seed and expects success).

Usage: python3 tests/fuzz/make_corpus.py [OUT_DIR]   (default: tests/fuzz/corpus next to this file)
Deterministic: same bytes on every run. Every seed stays under 10 KB. Seeds end in .bin, not
.gguf, because the repository .gitignore ignores *.gguf (real models).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType, GGUFWriter


# raw_shape of a quantized tensor is its byte shape: (rows, bytes per row).
def write(path, build, alignment=None):
    w = GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def empty(w):
    pass


def all_value_types(w):
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -123456)
    w.add_float32("t.f32", 1e-5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "hello \u0120world")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 3.25)
    w.add_array("t.arr_str", ["<s>", "a", "\u0120b", ""])
    w.add_array("t.arr_i32", [3, 1, 1, -2])
    w.add_array("t.arr_f32", [0.5, -1.0, 2.0])
    w.add_array("t.arr_bool", [True, False])
    w.add_key_value("t.arr_u8", [1, 2, 3], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
    w.add_key_value("t.arr_u64", [1, 2**40], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT64)
    w.add_key_value("t.arr_f64", [0.25, 1e300], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT64)


def rng_bytes(rng, n):
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def tiny_model(w):
    rng = np.random.default_rng(1)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<|endoftext|>", "a", "b", "ab"])
    w.add_token_types([3, 1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_tensor("token_embd.weight", rng_bytes(rng, 4 * 34), raw_shape=(4, 34), raw_dtype=Q.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(32).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng_bytes(rng, 32 * 18), raw_shape=(32, 18), raw_dtype=Q.Q4_0)
    w.add_tensor("blk.0.attn_k.weight", rng.standard_normal((16, 32)).astype(np.float16))
    w.add_tensor("blk.0.ffn_up.weight", rng_bytes(rng, 2 * 20), raw_shape=(2, 20), raw_dtype=Q.Q4_1)
    w.add_tensor("output_norm.weight", rng.standard_normal(32).astype(np.float32))


def kquant_tensors(w):
    rng = np.random.default_rng(2)
    for name, t, size in [("q2k", Q.Q2_K, 84), ("q3k", Q.Q3_K, 110), ("q4k", Q.Q4_K, 144),
                          ("q5k", Q.Q5_K, 176), ("q6k", Q.Q6_K, 210), ("q5_0", Q.Q5_0, 22 * 8),
                          ("q5_1", Q.Q5_1, 24 * 8)]:
        w.add_tensor(name, rng_bytes(rng, size), raw_shape=(1, size), raw_dtype=t)
    w.add_tensor("bf16", rng_bytes(rng, 8 * 2), raw_shape=(2, 2, 4), raw_dtype=Q.BF16)
    w.add_tensor("i32", np.arange(12, dtype=np.int32).reshape(3, 4))


def aligned64(w):
    w.add_string("general.name", "alignment 64")
    w.add_tensor("a", np.ones(5, dtype=np.float32))
    w.add_tensor("b", np.ones((2, 3), dtype=np.float32))


SEEDS = [
    ("empty.bin", empty, None),
    ("all_value_types.bin", all_value_types, None),
    ("tiny_model.bin", tiny_model, None),
    ("kquant_tensors.bin", kquant_tensors, None),
    ("aligned64.bin", aligned64, 64),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, build, alignment in SEEDS:
        path = os.path.join(out, name)
        write(path, build, alignment)
        size = os.path.getsize(path)
        assert size < 10 * 1024, f"{name}: {size} bytes"
        print(f"{path}: {size} bytes")
    # A version-2 copy of the tiny model (v2 and v3 share the layout).
    with open(os.path.join(out, "tiny_model.bin"), "rb") as f:
        data = bytearray(f.read())
    data[4:8] = (2).to_bytes(4, "little")
    with open(os.path.join(out, "tiny_model_v2.bin"), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
