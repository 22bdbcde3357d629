#!/usr/bin/env python3
"""kiln's llama.cpp order against llama.cpp itself, one weight type at a time.

For each type given (e.g. q4_0 q5_1 q5_K), kiln-mkmodel writes a tiny-qwen2 model of that type
(every matrix with n_out % 8 == 0, so ggml repacks Q4_0/Q4_K, except the tied output head of
559 rows, which it does not); llama-cpp-python (flash attention off, f16 cache, 2 threads)
evaluates the prompt as one batch, then 5 greedy tokens one at a time, and the FNV-1a hash of
each step's raw logits row is compared with kiln_logits_dump's in the llama.cpp order (same
prompt, same steps). A prompt of 8 or more tokens takes ggml's tiled K-quant kernels, a shorter
one its vec_dot (and Q4_0/Q4_K's gemm for groups of four rows, gemv for the rest).

  python3 scripts/check_llama_cpp_matmul_types.py build/tools/kiln-mkmodel/kiln-mkmodel \\
      build/tests/c_api/kiln_logits_dump [--prompt TEXT] [--order kiln|llama.cpp] TYPE...

Prints "TYPE: N/6 steps bitwise equal" per type; exits 1 when a type differs in the llama.cpp
order. (--order kiln shows that the check sees the last bit: kiln's own order differs.)
"""
import argparse
import subprocess
import sys

import llama_cpp
import numpy as np


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mkmodel")
    parser.add_argument("logits_dump")
    parser.add_argument("types", nargs="+")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--order", default="llama.cpp", choices=["kiln", "llama.cpp"])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    failed = False
    for type_name in args.types:
        path = f"/tmp/kiln_check_{type_name}.gguf"
        subprocess.run([args.mkmodel, "--shape", "tiny-qwen2", "--type", type_name, "--seed", "3",
                        "--out", path], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        llm = llama_cpp.Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=128,
                              n_batch=512, logits_all=False, flash_attn=False, verbose=False)
        ids = llm.tokenize(args.prompt.encode("utf-8"), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        want = []
        for step in range(args.steps + 1):
            ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)
            best = int(np.argmax(logits))  # the first maximum, as kiln_logits_dump
            want.append(f"step {step} token {best} logits {fnv1a64(logits.tobytes()):016x}")
            if step < args.steps:
                llm.eval([best])
        out = subprocess.run([args.logits_dump, path, args.prompt, str(args.steps), args.order],
                             capture_output=True, text=True, check=True).stdout
        got = [line for line in out.splitlines() if line.startswith("step")]
        same = sum(a == b for a, b in zip(want, got))
        print(f"{type_name}: {same}/{len(want)} steps bitwise equal ({len(ids)} prompt tokens, "
              f"kiln in the {args.order} order)")
        failed |= same != len(want) and args.order == "llama.cpp"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
