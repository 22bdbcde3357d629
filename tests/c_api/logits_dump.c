/* kiln_logits_dump MODEL PROMPT STEPS [ORDER]: prints, for a prompt and then STEPS greedy tokens
 * fed back one at a time, the argmax token and a 64-bit FNV-1a hash of the raw bits of the whole
 * logits row after each step, one line per step. ORDER: "kiln" (default), "llama.cpp"
 * (kiln_cache_params.llama_cpp_order) or "mla-measured" (kiln's order with
 * kiln_cache_params.mla_prefill = KILN_MLA_PREFILL_MEASURED; tests/c_api/mla_prefill_test.sh). Two
 * runs print the same lines exactly when every logit is bitwise the same, which is what the
 * CPU-level tests compare (tests/c_api/cpu_levels_test.sh, scripts/test_cpu_portability.sh): the
 * same program at KILN_CPU_LEVEL=scalar, avx2 and native, and under qemu-x86_64 as CPUs without
 * AVX-512 or AVX2. The CPU level goes to stderr. */
#include <kiln/kiln.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t Fnv1a64(const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static int Fail(const char* what, kiln_status s) {
  fprintf(stderr, "kiln_logits_dump: %s: %s (%s)\n", what, kiln_status_name(s),
          kiln_last_error_message());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5 ||
      (argc == 5 && strcmp(argv[4], "kiln") != 0 && strcmp(argv[4], "llama.cpp") != 0 &&
       strcmp(argv[4], "mla-measured") != 0)) {
    fprintf(stderr, "usage: kiln_logits_dump MODEL PROMPT STEPS [kiln|llama.cpp|mla-measured]\n");
    return 2;
  }
  const int steps = atoi(argv[3]);
  kiln_model_params mp;
  kiln_status s = kiln_model_params_init(&mp, sizeof mp);
  if (s != KILN_OK) return Fail("model params", s);
  mp.path = argv[1];
  kiln_model* model = NULL;
  s = kiln_model_load(&mp, &model);
  if (s != KILN_OK) return Fail("load", s);
  kiln_cache_params cp;
  s = kiln_cache_params_init(&cp, sizeof cp);
  if (s != KILN_OK) return Fail("cache params", s);
  cp.n_threads = 2;
  cp.n_ctx = 1024;
  cp.llama_cpp_order = argc == 5 && strcmp(argv[4], "llama.cpp") == 0;
  if (argc == 5 && strcmp(argv[4], "mla-measured") == 0) cp.mla_prefill = KILN_MLA_PREFILL_MEASURED;
  kiln_cache* cache = NULL;
  s = kiln_cache_create(model, &cp, &cache);
  if (s != KILN_OK) return Fail("cache", s);
  kiln_session* session = NULL;
  s = kiln_session_create(model, cache, NULL, &session);
  if (s != KILN_OK) return Fail("session", s);
  fprintf(stderr, "kiln_logits_dump: cpu %s\n", kiln_cpu_info());
  s = kiln_session_append_text(session, argv[2], strlen(argv[2]), 0);
  if (s != KILN_OK) return Fail("prompt", s);
  for (int step = 0; step <= steps; ++step) {
    const float* logits = NULL;
    int32_t n_vocab = 0;
    s = kiln_session_get_logits(session, &logits, &n_vocab);
    if (s != KILN_OK) return Fail("logits", s);
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    printf("step %d token %d logits %016llx\n", step, (int)best,
           (unsigned long long)Fnv1a64(logits, (size_t)n_vocab * sizeof(float)));
    if (step == steps) break;
    s = kiln_session_append_tokens(session, &best, 1);
    if (s != KILN_OK) return Fail("append", s);
  }
  kiln_session_destroy(session);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return 0;
}
