/* Sessions through the public C API (strict C11 + POSIX threads) on the real default model:
 * NULL handling, greedy generation with a callback that stops, stop strings, cancel (dropped
 * when no call is in flight; from the callback; from another thread during a long prefill and
 * during a generate), the token count read from another thread during a generate, busy
 * detection, cache full and recovery, fork/rewind, logits and logprobs, prefix-cache
 * statistics, saved states. */
#define _POSIX_C_SOURCE 200809L
#include <kiln/kiln.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_failures = 0;
#include "c_check.h"

static const char* kPrompt =
    "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n";

static kiln_session* new_session(kiln_model* model, kiln_cache* cache, const kiln_sampler* s) {
  kiln_session* session = NULL;
  CHECK(kiln_session_create(model, cache, s, &session) == KILN_OK);
  return session;
}

static void test_null_handles(kiln_model* model, kiln_cache* cache) {
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  kiln_cache* c = NULL;
  kiln_session* s = NULL;
  kiln_sampler* smp = NULL;
  kiln_generate_params gp;
  kiln_generate_params_init(&gp, sizeof gp);
  kiln_generate_result gr;
  const float* logits = NULL;
  int32_t n_vocab = 0;
  size_t n = 0;
  int32_t tok = 1;
  float lp = 0;
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  CHECK(kiln_cache_create(NULL, &cp, &c) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_cache_create(model, NULL, &c) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_cache_create(model, &cp, NULL) == KILN_ERR_INVALID_ARGUMENT);
  cp.kv_type = (kiln_kv_type)7;
  CHECK(kiln_cache_create(model, &cp, &c) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "kv_type") != NULL);
  /* A q8_0 cache: 34 bytes per 32 values; 30 layers x 3 KV heads x (K, V) x 64 values. */
  kiln_cache_params_init(&cp, sizeof cp);
  cp.kv_type = KILN_KV_Q8_0;
  cp.n_ctx = 64;
  CHECK(kiln_cache_create(model, &cp, &c) == KILN_OK);
  {
    kiln_cache_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(kiln_cache_get_stats(c, &st) == KILN_OK);
    CHECK(st.bytes_per_token == 30 * 3 * 2 * 68);
  }
  kiln_cache_destroy(c);
  c = NULL;
  kiln_cache_params_init(&cp, sizeof cp);
  cp.pool_bytes = 1000;
  CHECK(kiln_cache_create(model, &cp, &c) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "pool_bytes") != NULL);
  kiln_cache_params_init(&cp, sizeof cp);
  cp.block_size = 0;
  CHECK(kiln_cache_create(model, &cp, &c) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "block_size") != NULL);
  kiln_cache_params_init(&cp, sizeof cp);
  cp.struct_size = 4;
  CHECK(kiln_cache_create(model, &cp, &c) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_sampler_create(NULL, &smp) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_create(NULL, cache, NULL, &s) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_create(model, NULL, NULL, &s) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_create(model, cache, NULL, NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_append_text(NULL, "x", 1, 0) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_append_tokens(NULL, &tok, 1) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_append_tokens_scored(NULL, &tok, 2, &lp) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_generate(NULL, &gp, &gr) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_cancel(NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_fork(NULL, &s) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_rewind(NULL, 0) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_get_logits(NULL, &logits, &n_vocab) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_get_tokens(NULL, NULL, 0, &n) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_get_logprobs(NULL, NULL, 0, &n) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_cache_get_stats(NULL, NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_n_tokens(NULL) == 0);
  kiln_session_destroy(NULL);
  kiln_cache_destroy(NULL);
  kiln_sampler_destroy(NULL);

  /* Bad input on a live session. */
  s = new_session(model, cache, NULL);
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_ERR_INVALID_ARGUMENT); /* empty session */
  CHECK(kiln_session_get_logits(s, &logits, &n_vocab) == KILN_ERR_INVALID_ARGUMENT);
  tok = 1 << 30;
  CHECK(kiln_session_append_tokens(s, &tok, 1) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "index 0") != NULL);
  CHECK(kiln_session_rewind(s, 1) == KILN_ERR_OUT_OF_RANGE);
  CHECK(kiln_session_append_text(s, "x", 1, 99u) == KILN_ERR_INVALID_ARGUMENT);
  kiln_session_destroy(s);
}

typedef struct collect {
  char text[4096];
  size_t len;
  int calls;
  int stop_after; /* 0: never */
  kiln_session* cancel_session;
} collect;

static int collect_cb(int32_t token, const char* piece, size_t piece_len, void* user_data) {
  collect* c = (collect*)user_data;
  if (c->len + piece_len < sizeof c->text) {
    memcpy(c->text + c->len, piece, piece_len);
    c->len += piece_len;
    c->text[c->len] = '\0';
  }
  if (token >= 0) ++c->calls;
  if (c->cancel_session && c->calls == 2) kiln_session_cancel(c->cancel_session);
  return c->stop_after > 0 && c->calls >= c->stop_after;
}

static void test_generate(kiln_model* model, kiln_cache* cache) {
  kiln_session* s = new_session(model, cache, NULL);
  kiln_generate_params gp;
  kiln_generate_params_init(&gp, sizeof gp);
  kiln_generate_result gr;
  collect full, again, stopped, cut;
  size_t n_prompt;
  const float* logits = NULL;
  int32_t n_vocab = 0;
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  memset(&full, 0, sizeof full);
  CHECK(kiln_session_append_text(s, kPrompt, strlen(kPrompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
        KILN_OK);
  n_prompt = kiln_session_n_tokens(s);
  CHECK(n_prompt > 10);
  CHECK(kiln_session_get_logits(s, &logits, &n_vocab) == KILN_OK);
  CHECK(n_vocab == 49152 && logits != NULL && isfinite(logits[0]));
  gp.max_tokens = 20;
  gp.callback = collect_cb;
  gp.user_data = &full;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  CHECK(gr.n_tokens > 0 && gr.n_tokens <= 20);
  CHECK(gr.stop_reason == KILN_STOP_MAX_TOKENS || gr.stop_reason == KILN_STOP_EOG);
  CHECK(full.len > 0);
  CHECK(kiln_session_n_tokens(s) == n_prompt + (size_t)gr.n_tokens);
  printf("greedy: %s\n", full.text);

  /* Rewind to the prompt and generate again: greedy repeats itself. */
  CHECK(kiln_session_rewind(s, (size_t)gr.n_tokens) == KILN_OK);
  memset(&again, 0, sizeof again);
  gp.user_data = &again;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  CHECK(strcmp(again.text, full.text) == 0);

  /* A callback that stops after 3 tokens. */
  CHECK(kiln_session_rewind(s, (size_t)gr.n_tokens) == KILN_OK);
  memset(&stopped, 0, sizeof stopped);
  stopped.stop_after = 3;
  gp.user_data = &stopped;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  CHECK(gr.stop_reason == KILN_STOP_CALLBACK);
  CHECK(gr.n_tokens == 3 && stopped.calls == 3);
  CHECK(strncmp(full.text, stopped.text, stopped.len) == 0);

  /* A stop string from the middle of the greedy text: output ends right before it. */
  if (full.len > 12) {
    char stop[5];
    const char* stops[1];
    memcpy(stop, full.text + full.len / 2, 4);
    stop[4] = '\0';
    stops[0] = stop;
    CHECK(kiln_session_rewind(s, (size_t)gr.n_tokens) == KILN_OK);
    memset(&cut, 0, sizeof cut);
    gp.user_data = &cut;
    gp.stop_strings = stops;
    gp.n_stop_strings = 1;
    CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
    CHECK(gr.stop_reason == KILN_STOP_STRING);
    CHECK(cut.len == (size_t)(strstr(full.text, stop) - full.text));
    CHECK(strncmp(cut.text, full.text, cut.len) == 0);
    gp.stop_strings = NULL;
    gp.n_stop_strings = 0;
  }

  /* Cancel from inside the callback (any thread, the generating one included). */
  {
    collect cc;
    CHECK(kiln_session_rewind(s, (size_t)gr.n_tokens) == KILN_OK);
    memset(&cc, 0, sizeof cc);
    cc.cancel_session = s;
    gp.user_data = &cc;
    CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
    CHECK(gr.stop_reason == KILN_STOP_CANCELLED);
    CHECK(gr.n_tokens == 2);
  }
  /* A cancel applies only to the call in flight: one sent while no call runs (here, right
   * after the generate it would have stopped ended) has no effect on the next call. */
  CHECK(kiln_session_cancel(s) == KILN_OK);
  CHECK(kiln_session_append_text(s, " ok", 3, 0) == KILN_OK);
  {
    const size_t before = kiln_session_n_tokens(s);
    CHECK(kiln_session_cancel(s) == KILN_OK);
    gp.user_data = NULL;
    gp.callback = NULL;
    gp.max_tokens = 4;
    CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
    CHECK(gr.stop_reason != KILN_STOP_CANCELLED);
    CHECK(gr.n_tokens > 0);
    CHECK(kiln_session_n_tokens(s) == before + (size_t)gr.n_tokens);
    CHECK(kiln_session_rewind(s, (size_t)gr.n_tokens) == KILN_OK);
    gp.callback = collect_cb;
    gp.max_tokens = 20;
  }

  /* Fork shares the prefix and continues identically. */
  {
    kiln_session* f = NULL;
    collect a, b;
    CHECK(kiln_session_fork(s, &f) == KILN_OK);
    CHECK(kiln_session_n_tokens(f) == kiln_session_n_tokens(s));
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    gp.max_tokens = 6;
    gp.user_data = &a;
    CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
    gp.user_data = &b;
    CHECK(kiln_session_generate(f, &gp, &gr) == KILN_OK);
    CHECK(strcmp(a.text, b.text) == 0);
    kiln_session_destroy(f);
  }
  kiln_session_destroy(s);
}

static void test_sampler_and_logprobs(kiln_model* model, kiln_cache* cache) {
  kiln_sampler_params sp;
  kiln_sampler_params_init(&sp, sizeof sp);
  kiln_sampler* sampler = NULL;
  kiln_logit_bias bias[1];
  kiln_generate_params gp;
  kiln_generate_params_init(&gp, sizeof gp);
  kiln_generate_result gr;
  int32_t tokens_a[64], tokens_b[64];
  size_t na = 0, nb = 0;
  kiln_token_logprob lp[5];
  size_t n_lp = 0;
  int run;
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  CHECK(sp.temperature > 0.79f && sp.temperature < 0.81f && sp.top_k == 40);
  sp.repeat_penalty = 0.0f;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "repeat_penalty") != NULL);
  kiln_sampler_params_init(&sp, sizeof sp);
  bias[0].token = 60000; /* past the vocabulary: rejected when a session uses it */
  bias[0].bias = 1.0f;
  sp.logit_bias = bias;
  sp.n_logit_bias = 1;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_OK);
  {
    kiln_session* bad = NULL;
    CHECK(kiln_session_create(model, cache, sampler, &bad) == KILN_ERR_INVALID_ARGUMENT);
  }
  kiln_sampler_destroy(sampler);
  sp.n_logit_bias = 0;
  sp.seed = 1234;
  sp.n_logprobs = 5;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_OK);
  gp.max_tokens = 12;
  for (run = 0; run < 2; ++run) {
    kiln_session* s = new_session(model, cache, sampler);
    CHECK(kiln_session_append_text(s, kPrompt, strlen(kPrompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
          KILN_OK);
    CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
    CHECK(kiln_session_get_tokens(s, run ? tokens_b : tokens_a, 64, run ? &nb : &na) == KILN_OK);
    CHECK(kiln_session_get_logprobs(s, NULL, 0, &n_lp) == KILN_ERR_BUFFER_TOO_SMALL);
    CHECK(n_lp == 5);
    CHECK(kiln_session_get_logprobs(s, lp, 5, &n_lp) == KILN_OK);
    CHECK(lp[0].logprob <= 0.0f && lp[0].logprob >= lp[4].logprob);
    kiln_session_destroy(s);
  }
  kiln_sampler_destroy(sampler); /* sessions keep their own copy; already gone here */
  CHECK(na == nb && na > 0 && memcmp(tokens_a, tokens_b, na * sizeof(int32_t)) == 0);
}

static void test_cache_full(kiln_model* model, size_t block_bytes) {
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  kiln_cache* cache = NULL;
  kiln_session *a, *b;
  int32_t prompt[40];
  int i;
  cp.pool_bytes = 5 * block_bytes; /* the null block + 4 blocks of 16 tokens */
  cp.prefix_caching = 0;
  cp.n_threads = 2;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  for (i = 0; i < 40; ++i) prompt[i] = 1000 + i * 7;
  a = new_session(model, cache, NULL);
  b = new_session(model, cache, NULL);
  CHECK(kiln_session_append_tokens(a, prompt, 40) == KILN_OK);             /* 3 blocks */
  CHECK(kiln_session_append_tokens(b, prompt, 30) == KILN_ERR_CACHE_FULL); /* needs 2 */
  CHECK(kiln_session_n_tokens(b) == 0);
  kiln_session_destroy(a);
  CHECK(kiln_session_append_tokens(b, prompt, 30) == KILN_OK);
  CHECK(kiln_session_n_tokens(b) == 30);
  kiln_session_destroy(b);
  kiln_cache_destroy(cache);
}

typedef struct prefill_job {
  kiln_session* session;
  const int32_t* tokens;
  size_t n;
  kiln_status status;
  atomic_int done;
} prefill_job;

static void* prefill_thread(void* arg) {
  prefill_job* job = (prefill_job*)arg;
  /* The main thread probes the session with rewind(0); retry while it holds it. */
  do {
    job->status = kiln_session_append_tokens(job->session, job->tokens, job->n);
  } while (job->status == KILN_ERR_BUSY);
  atomic_store(&job->done, 1);
  return NULL;
}

static void test_cancel_during_prefill(kiln_model* model, kiln_cache* cache) {
  enum { kN = 3000 };
  static int32_t tokens[kN];
  kiln_session* s = new_session(model, cache, NULL);
  prefill_job job;
  pthread_t thread;
  int i;
  for (i = 0; i < kN; ++i) tokens[i] = 300 + (i * 7919) % 40000;
  job.session = s;
  job.tokens = tokens;
  job.n = kN;
  job.status = KILN_OK;
  atomic_init(&job.done, 0);
  CHECK(pthread_create(&thread, NULL, prefill_thread, &job) == 0);
  /* Wait until the worker is inside the append: a second thread's call is then BUSY. */
  while (kiln_session_rewind(s, 0) != KILN_ERR_BUSY) {
    if (atomic_load(&job.done)) break;
  }
  CHECK(!atomic_load(&job.done));
  CHECK(strstr(kiln_last_error_message(), "busy") != NULL);
  CHECK(kiln_session_cancel(s) == KILN_OK);
  pthread_join(thread, NULL);
  CHECK(job.status == KILN_ERR_CANCELLED);
  CHECK(kiln_session_n_tokens(s) == 0);
  CHECK(kiln_session_append_tokens(s, tokens, 8) == KILN_OK);
  kiln_session_destroy(s);
}

typedef struct generate_job {
  kiln_session* session;
  kiln_generate_params params;
  kiln_generate_result result;
  kiln_status status;
  atomic_int done;
} generate_job;

static void* generate_thread(void* arg) {
  generate_job* job = (generate_job*)arg;
  job->status = kiln_session_generate(job->session, &job->params, &job->result);
  atomic_store(&job->done, 1);
  return NULL;
}

/* While a generate runs on another thread, kiln_session_n_tokens reports the growing count
 * (never 0, never decreasing, never below the prompt), and kiln_session_cancel from this thread
 * stops the generate. Greedy with every end-of-generation token banned, so that only the cancel
 * (or max_tokens, which would fail the test) ends it. */
static void test_cancel_and_count_during_generate(kiln_model* model, kiln_cache* cache) {
  enum { kMaxTokens = 1000, kCancelAfter = 8 };
  kiln_model_info info;
  kiln_sampler_params sp;
  kiln_sampler* sampler = NULL;
  kiln_logit_bias* bans;
  size_t n_bans = 0, n_prompt, last, reads = 0, decreases = 0, below_prompt = 0;
  int32_t t;
  int cancelled = 0;
  kiln_session* s;
  generate_job job;
  pthread_t thread;
  const struct timespec pause = {0, 100000}; /* 0.1 ms: leave the cores to the generate */
  info.struct_size = sizeof info;
  CHECK(kiln_model_get_info(model, &info) == KILN_OK);
  bans = (kiln_logit_bias*)malloc(sizeof(kiln_logit_bias) * (size_t)info.n_vocab);
  for (t = 0; t < info.n_vocab; ++t) {
    if (kiln_model_token_is_eog(model, t)) {
      bans[n_bans].token = t;
      bans[n_bans].bias = -INFINITY;
      ++n_bans;
    }
  }
  CHECK(n_bans > 0);
  kiln_sampler_params_init(&sp, sizeof sp);
  sp.temperature = 0.0f;
  sp.logit_bias = bans;
  sp.n_logit_bias = n_bans;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_OK);
  free(bans);
  s = new_session(model, cache, sampler);
  kiln_sampler_destroy(sampler);
  CHECK(kiln_session_append_text(s, kPrompt, strlen(kPrompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
        KILN_OK);
  n_prompt = kiln_session_n_tokens(s);
  CHECK(n_prompt > 10);

  job.session = s;
  kiln_generate_params_init(&job.params, sizeof job.params);
  job.params.max_tokens = kMaxTokens;
  memset(&job.result, 0, sizeof job.result);
  job.result.struct_size = sizeof job.result;
  job.status = KILN_ERR_INTERNAL;
  atomic_init(&job.done, 0);
  last = n_prompt;
  CHECK(pthread_create(&thread, NULL, generate_thread, &job) == 0);
  while (!atomic_load(&job.done)) {
    const size_t n = kiln_session_n_tokens(s);
    ++reads;
    if (n < last) ++decreases;
    if (n < n_prompt) ++below_prompt;
    last = n;
    if (!cancelled && n >= n_prompt + kCancelAfter) {
      CHECK(kiln_session_cancel(s) == KILN_OK);
      cancelled = 1;
    }
    nanosleep(&pause, NULL);
  }
  pthread_join(thread, NULL);
  CHECK(reads > 0);
  CHECK(decreases == 0);
  CHECK(below_prompt == 0);
  CHECK(cancelled);
  CHECK(job.status == KILN_OK);
  CHECK(job.result.stop_reason == KILN_STOP_CANCELLED);
  CHECK(job.result.n_tokens >= kCancelAfter && job.result.n_tokens < kMaxTokens);
  CHECK(kiln_session_n_tokens(s) == n_prompt + (size_t)job.result.n_tokens);
  CHECK(last <= kiln_session_n_tokens(s));
  printf("cancel from another thread: stopped after %d tokens, %zu concurrent count reads\n",
         (int)job.result.n_tokens, reads);
  kiln_session_destroy(s);
}

static void test_prefix_cache(kiln_model* model) {
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  kiln_cache* cache = NULL;
  kiln_cache_stats st;
  const char* sys =
      "<|im_start|>system\nYou are a careful assistant. Answer briefly, in plain words, and "
      "say so when you do not know. Never invent facts or sources.<|im_end|>\n";
  char a[512], b[512];
  kiln_session *s1, *s2;
  cp.n_threads = 2;
  cp.n_ctx = 1024;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  snprintf(a, sizeof a, "%s<|im_start|>user\nHi!<|im_end|>\n", sys);
  snprintf(b, sizeof b, "%s<|im_start|>user\nWhat is rain?<|im_end|>\n", sys);
  s1 = new_session(model, cache, NULL);
  CHECK(kiln_session_append_text(s1, a, strlen(a), KILN_TOKENIZE_PARSE_SPECIAL) == KILN_OK);
  s2 = new_session(model, cache, NULL);
  CHECK(kiln_session_append_text(s2, b, strlen(b), KILN_TOKENIZE_PARSE_SPECIAL) == KILN_OK);
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(kiln_cache_get_stats(cache, &st) == KILN_OK);
  CHECK(st.n_ctx == 1024 && st.block_size == 16 && st.n_sequences == 2);
  CHECK(st.prefix_hit_tokens >= 16); /* the shared system prompt's whole blocks */
  printf("prefix cache: %lld of %lld query tokens hit\n", (long long)st.prefix_hit_tokens,
         (long long)st.prefix_query_tokens);
  kiln_session_destroy(s1);
  kiln_session_destroy(s2);
  kiln_cache_destroy(cache);
}

/* llama_cpp_order: the C API reproduces llama.cpp's greedy tokens (the first golden case of
 * tests/data/golden/smollm2_greedy.json: raw prompt "The capital of France is", llama.cpp's
 * default f16 KV cache, 32 tokens). A caller built before the field existed (smaller
 * struct_size) still creates caches, in the default order. */
static int32_t collect_ids[64];
static int collect_n = 0;
static int collect_ids_cb(int32_t token, const char* piece, size_t piece_len, void* user_data) {
  (void)user_data;
  (void)piece;
  (void)piece_len;
  if (token >= 0 && collect_n < 64) collect_ids[collect_n++] = token;
  return 0;
}

static void test_llama_cpp_order(kiln_model* model) {
  static const int32_t kPromptIds[] = {504, 3575, 282, 4649, 314};
  static const int32_t kLlamaCpp[32] = {7042, 30,   198, 198, 504,  1797, 1918, 553, 253, 2155, 282,
                                        4723, 216,  35,  33,  33,   2215, 701,  30,  198, 198,  504,
                                        1797, 1918, 553, 253, 2155, 282,  4723, 216, 35,  33};
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  kiln_cache* cache = NULL;
  kiln_session* s = NULL;
  kiln_generate_params gp;
  kiln_generate_params_init(&gp, sizeof gp);
  kiln_generate_result gr;
  int i;
  cp.n_threads = 2;
  cp.n_ctx = 512;
  cp.llama_cpp_order = 1;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  s = new_session(model, cache, NULL); /* NULL sampler: greedy */
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  CHECK(kiln_session_append_tokens(s, kPromptIds, 5) == KILN_OK);
  gp.max_tokens = 32;
  gp.callback = collect_ids_cb;
  collect_n = 0;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  CHECK(collect_n == 32);
  for (i = 0; i < 32 && i < collect_n; ++i) CHECK(collect_ids[i] == kLlamaCpp[i]);
  kiln_session_destroy(s);
  kiln_cache_destroy(cache);

  /* llama_cpp_order is part of the first release (0.2): a struct that ends before it is below
   * the smallest size accepted (tests/c_api/c_abi_test.c tests the rule for every struct). */
  kiln_cache_params_init(&cp, sizeof cp);
  cp.struct_size = (uint32_t)offsetof(kiln_cache_params, llama_cpp_order);
  cache = NULL;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  CHECK(strstr(kiln_last_error_message(), "kiln_cache_params") != NULL);
}

/* Speculative decoding through the C API: n-gram greedy output equals plain greedy output on a
 * copy-heavy prompt and accepts drafts; with a pinned pass cost a sampled text repeats for a
 * fixed seed; bad parameters name the field. */
static void generate_ids(kiln_model* model, kiln_cache* cache, const kiln_sampler* sampler,
                         kiln_strategy* strategy, const char* prompt, int32_t n,
                         kiln_spec_metrics* metrics) {
  kiln_session* s = new_session(model, cache, sampler);
  kiln_generate_params gp;
  kiln_generate_params_init(&gp, sizeof gp);
  kiln_generate_result gr;
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  CHECK(kiln_session_append_text(s, prompt, strlen(prompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
        KILN_OK);
  CHECK(kiln_session_set_strategy(s, strategy) == KILN_OK);
  gp.max_tokens = n;
  gp.callback = collect_ids_cb;
  collect_n = 0;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  if (metrics != NULL) CHECK(kiln_session_get_spec_metrics(s, metrics) == KILN_OK);
  kiln_session_destroy(s);
}

static void test_speculative(kiln_model* model, kiln_cache* cache) {
  static const char kCopy[] =
      "<|im_start|>user\nRepeat this list exactly: alpha beta gamma delta epsilon zeta eta theta "
      "iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon<|im_end|>\n"
      "<|im_start|>assistant\n";
  int32_t plain[48], again[48];
  int n_plain, i;
  kiln_ngram_params np;
  kiln_ngram_params_init(&np, sizeof np);
  kiln_strategy* ngram = NULL;
  kiln_sampler_params sp;
  kiln_sampler_params_init(&sp, sizeof sp);
  kiln_sampler* sampler = NULL;
  kiln_spec_metrics m;
  CHECK(np.fixed_pass_cost_beta < 0); /* measured by default */
  np.fixed_pass_cost_beta = 0.25;     /* pinned: deterministic draft lengths */
  CHECK(kiln_strategy_create_ngram(&np, &ngram) == KILN_OK);
  if (ngram == NULL) return;

  generate_ids(model, cache, NULL, NULL, kCopy, 48, NULL);
  n_plain = collect_n;
  memcpy(plain, collect_ids, sizeof plain);
  CHECK(n_plain > 16);
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  generate_ids(model, cache, NULL, ngram, kCopy, 48, &m);
  CHECK(collect_n == n_plain);
  for (i = 0; i < n_plain && i < collect_n; ++i) CHECK(collect_ids[i] == plain[i]);
  CHECK(m.drafted > 0 && m.accepted > 0);
  CHECK(m.target_passes_per_token < 1.0);
  printf("n-gram: %lld drafted, %lld accepted, %.3f target passes per token\n",
         (long long)m.drafted, (long long)m.accepted, m.target_passes_per_token);

  sp.seed = 7;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_OK);
  generate_ids(model, cache, sampler, ngram, kCopy, 48, NULL);
  n_plain = collect_n;
  memcpy(again, collect_ids, sizeof again);
  generate_ids(model, cache, sampler, ngram, kCopy, 48, NULL);
  CHECK(collect_n == n_plain);
  for (i = 0; i < n_plain && i < collect_n; ++i) CHECK(collect_ids[i] == again[i]);
  kiln_sampler_destroy(sampler);
  kiln_strategy_destroy(ngram);

  kiln_ngram_params_init(&np, sizeof np);
  np.struct_size = (uint32_t)offsetof(kiln_ngram_params, fixed_pass_cost_beta);
  ngram = NULL;
  CHECK(kiln_strategy_create_ngram(&np, &ngram) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(ngram == NULL);
  kiln_ngram_params_init(&np, sizeof np);
  np.max_draft = 0;
  CHECK(kiln_strategy_create_ngram(&np, &ngram) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "max_draft") != NULL);
}

/* Typical acceptance (lossy) through the C API with the committed EAGLE head: bad thresholds are
 * refused naming the field; a sampled text reports every accepted draft token as lossy, exact
 * verification none; a caller from before accepted_lossy has its struct left as it was there. */
static void test_typical_acceptance(kiln_model* model, kiln_cache* cache) {
  static const char kPrompt[] =
      "<|im_start|>user\nWhat should I pack for a weekend of hiking?<|im_end|>\n"
      "<|im_start|>assistant\n";
  const char* head = KILN_SOURCE_DIR "/models/SmolLM2-135M-Instruct.eagle.gguf";
  kiln_eagle_params ep;
  kiln_strategy* exact = NULL;
  kiln_strategy* typical = NULL;
  kiln_sampler_params sp;
  kiln_sampler* sampler = NULL;
  kiln_spec_metrics m, old;
  kiln_eagle_params_init(&ep, sizeof ep);
  ep.merge_ngram = 0;
  /* A fixed tree: the default one follows the measured costs, and a sanitizer's are others. */
  ep.tree_tokens = 8;
  ep.top_k = 4;
  ep.max_depth = 3;
  CHECK(kiln_strategy_create_eagle(model, head, &ep, &exact) == KILN_OK);
  ep.typical_acceptance = 1;
  ep.typical_epsilon = 0.0f;
  CHECK(kiln_strategy_create_eagle(model, head, &ep, &typical) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "epsilon") != NULL);
  ep.typical_epsilon = 0.09f;
  ep.typical_delta = -1.0f;
  CHECK(kiln_strategy_create_eagle(model, head, &ep, &typical) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "delta") != NULL);
  ep.typical_delta = 0.3f;
  CHECK(kiln_strategy_create_eagle(model, head, &ep, &typical) == KILN_OK);
  kiln_sampler_params_init(&sp, sizeof sp);
  sp.temperature = 0.8f;
  sp.seed = 3;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_OK);
  if (exact == NULL || typical == NULL || sampler == NULL) return;

  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  generate_ids(model, cache, sampler, typical, kPrompt, 32, &m);
  CHECK(m.accepted > 0 && m.accepted_lossy == m.accepted);
  printf("typical acceptance: %lld steps, %lld accepted, %lld lossy\n", (long long)m.steps,
         (long long)m.accepted, (long long)m.accepted_lossy);
  memset(&old, 0, sizeof old);
  old.struct_size = (uint32_t)offsetof(kiln_spec_metrics, accepted_lossy);
  old.accepted_lossy = -5;
  generate_ids(model, cache, sampler, typical, kPrompt, 32, &old);
  CHECK(old.steps > 0 && old.accepted_lossy == -5);
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  generate_ids(model, cache, sampler, exact, kPrompt, 32, &m);
  CHECK(m.steps > 0 && m.accepted_lossy == 0);
  kiln_sampler_destroy(sampler);
  kiln_strategy_destroy(typical);
  kiln_strategy_destroy(exact);
}

/* Saved states: a seeded session saved (to a buffer with and without K/V, and to a file) and
 * restored into new sessions continues with exactly the tokens the original generates; bad
 * input (NULL, small buffer, bad struct_size, truncated or corrupted bytes, a missing file) is
 * refused with the documented status and leaves the target session unchanged. */
static void continue_ids(kiln_session* s, int32_t n, int32_t* out, size_t* n_out) {
  kiln_generate_params gp;
  kiln_generate_result gr;
  kiln_generate_params_init(&gp, sizeof gp);
  memset(&gr, 0, sizeof gr);
  gr.struct_size = sizeof gr;
  gp.max_tokens = n;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  CHECK(kiln_session_get_tokens(s, out, 256, n_out) == KILN_OK);
}

static void test_saved_state(kiln_model* model, kiln_cache* cache) {
  kiln_sampler_params sp;
  kiln_sampler* sampler = NULL;
  kiln_state_params params;
  kiln_session *a, *b;
  size_t size = 0, state_size = 0, small_size = 0, n_saved = 0, n_expected = 0, n_got = 0;
  size_t n_before = 0, i;
  char* state;
  char* small;
  char path[] = "/tmp/kiln-c-state-XXXXXX";
  int fd;
  int32_t expected[256], got[256];
  int mode;
  kiln_sampler_params_init(&sp, sizeof sp);
  sp.seed = 4242;
  CHECK(kiln_sampler_create(&sp, &sampler) == KILN_OK);
  a = new_session(model, cache, sampler);
  CHECK(kiln_session_append_text(a, kPrompt, strlen(kPrompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
        KILN_OK);
  continue_ids(a, 6, got, &n_saved);

  CHECK(kiln_state_params_init(&params, sizeof params) == KILN_OK);
  CHECK(params.kv == 1 && params.strategy == 1);
  CHECK(kiln_session_save_state(a, NULL, NULL, 0, &size) == KILN_ERR_BUFFER_TOO_SMALL);
  CHECK(size > 6 * 20000); /* about 23 KB of K/V per token */
  state = (char*)malloc(size);
  CHECK(kiln_session_save_state(a, NULL, state, size - 1, &size) == KILN_ERR_BUFFER_TOO_SMALL);
  CHECK(kiln_session_save_state(a, &params, state, size, &size) == KILN_OK);
  state_size = size;
  params.kv = 0;
  CHECK(kiln_session_save_state(a, &params, NULL, 0, &small_size) == KILN_ERR_BUFFER_TOO_SMALL);
  CHECK(small_size > 0 && small_size < 4096);
  small = (char*)malloc(small_size);
  CHECK(kiln_session_save_state(a, &params, small, small_size, &small_size) == KILN_OK);
  fd = mkstemp(path);
  CHECK(fd >= 0);
  /* Closed before the library replaces the file: Windows refuses to rename over an open one. */
  if (fd >= 0) close(fd);
  CHECK(kiln_session_save_state_file(a, NULL, path) == KILN_OK);
  continue_ids(a, 10, expected, &n_expected);
  CHECK(n_expected > n_saved);

  for (mode = 0; mode < 3; ++mode) {
    b = new_session(model, cache, NULL); /* greedy, no seed: the state brings its own */
    if (mode == 0) CHECK(kiln_session_load_state(b, state, state_size) == KILN_OK);
    if (mode == 1) CHECK(kiln_session_load_state(b, small, small_size) == KILN_OK);
    if (mode == 2) CHECK(kiln_session_load_state_file(b, path) == KILN_OK);
    CHECK(kiln_session_n_tokens(b) == n_saved);
    continue_ids(b, 10, got, &n_got);
    CHECK(n_got == n_expected);
    for (i = 0; i < n_got && i < n_expected; ++i) CHECK(got[i] == expected[i]);
    kiln_session_destroy(b);
  }

  /* Refusals leave the target as it was. */
  b = new_session(model, cache, NULL);
  CHECK(kiln_session_append_text(b, "Hello", 5, 0) == KILN_OK);
  n_before = kiln_session_n_tokens(b);
  CHECK(kiln_session_save_state(NULL, NULL, NULL, 0, &size) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_save_state(b, NULL, NULL, 0, NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_save_state(b, NULL, NULL, 10, &size) == KILN_ERR_INVALID_ARGUMENT);
  kiln_state_params_init(&params, sizeof params);
  params.struct_size = 4;
  CHECK(kiln_session_save_state(b, &params, NULL, 0, &size) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "kiln_state_params") != NULL);
  CHECK(kiln_session_load_state(NULL, state, state_size) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_load_state(b, NULL, 5) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_load_state(b, state, state_size / 2) == KILN_ERR_FORMAT);
  CHECK(kiln_session_load_state(b, small, small_size - 1) == KILN_ERR_FORMAT);
  small[small_size - 3] ^= 0x40;
  CHECK(kiln_session_load_state(b, small, small_size) == KILN_ERR_FORMAT);
  CHECK(strstr(kiln_last_error_message(), "CRC-32C") != NULL);
  CHECK(kiln_session_load_state_file(b, "/nonexistent/kiln.state") == KILN_ERR_IO);
  CHECK(kiln_session_load_state_file(b, NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_save_state_file(b, NULL, "/nonexistent/dir/kiln.state") == KILN_ERR_IO);
  CHECK(kiln_session_n_tokens(b) == n_before);

  remove(path);
  free(state);
  free(small);
  kiln_session_destroy(b);
  kiln_session_destroy(a);
  kiln_sampler_destroy(sampler);
}

/* Each test takes the shared model and cache (some make their own). */
typedef struct {
  const char* name;
  void (*run)(kiln_model* model, kiln_cache* cache, size_t block_bytes);
} named_test;

#define ADAPT_MODEL_CACHE(fn)                                    \
  static void run_##fn(kiln_model* m, kiln_cache* c, size_t b) { \
    (void)b;                                                     \
    test_##fn(m, c);                                             \
  }
#define ADAPT_MODEL(fn)                                          \
  static void run_##fn(kiln_model* m, kiln_cache* c, size_t b) { \
    (void)b;                                                     \
    (void)c;                                                     \
    test_##fn(m);                                                \
  }
ADAPT_MODEL_CACHE(null_handles)
ADAPT_MODEL_CACHE(generate)
ADAPT_MODEL(llama_cpp_order)
ADAPT_MODEL_CACHE(speculative)
ADAPT_MODEL_CACHE(typical_acceptance)
ADAPT_MODEL_CACHE(sampler_and_logprobs)
ADAPT_MODEL_CACHE(cancel_during_prefill)
ADAPT_MODEL_CACHE(cancel_and_count_during_generate)
ADAPT_MODEL(prefix_cache)
ADAPT_MODEL_CACHE(saved_state)
static void run_cache_full(kiln_model* m, kiln_cache* c, size_t b) {
  (void)c;
  test_cache_full(m, b);
}

static const named_test kTests[] = {
    {"null_handles", run_null_handles},
    {"generate", run_generate},
    {"llama_cpp_order", run_llama_cpp_order},
    {"speculative", run_speculative},
    {"typical_acceptance", run_typical_acceptance},
    {"sampler_and_logprobs", run_sampler_and_logprobs},
    {"cache_full", run_cache_full},
    {"cancel_during_prefill", run_cancel_during_prefill},
    {"cancel_and_count_during_generate", run_cancel_and_count_during_generate},
    {"prefix_cache", run_prefix_cache},
    {"saved_state", run_saved_state},
};

static int selected(const char* name, int argc, char** argv) {
  if (argc <= 1) return 1;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], name) == 0) return 1;
  }
  return 0;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Usage: c_session_test [TEST...]   (default: every test; names as in kTests) */
int main(int argc, char** argv) {
  char path[1024];
  const char* dir = getenv("KILN_MODEL_DIR");
  const char* home = getenv("HOME");
  kiln_model_params mp;
  kiln_model_params_init(&mp, sizeof mp);
  kiln_model* model = NULL;
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  kiln_cache* cache = NULL;
  kiln_cache_stats st;
  if (dir && *dir) {
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
  } else {
    snprintf(path, sizeof path, "%s/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
  }
  mp.path = path;
  CHECK(kiln_model_load(&mp, &model) == KILN_OK);
  if (model == NULL) return 1;
  cp.n_threads = 2;
  cp.n_ctx = 4096;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return 1;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(kiln_cache_get_stats(cache, &st) == KILN_OK);
  for (int i = 1; i < argc; ++i) {
    int known = 0;
    for (size_t t = 0; t < sizeof kTests / sizeof kTests[0]; ++t)
      known |= !strcmp(argv[i], kTests[t].name);
    if (!known) {
      fprintf(stderr, "c_session_test: no test named '%s'\n", argv[i]);
      return 2;
    }
  }
  for (size_t t = 0; t < sizeof kTests / sizeof kTests[0]; ++t) {
    if (!selected(kTests[t].name, argc, argv)) continue;
    const int failures_before = g_failures;
    const double start = now_seconds();
    kTests[t].run(model, cache, st.block_bytes);
    printf("c_session_test: %s %s (%.1f s)\n", kTests[t].name,
           g_failures == failures_before ? "passed" : "FAILED", now_seconds() - start);
  }
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  if (g_failures) {
    fprintf(stderr, "c_session_test: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("c_session_test: all checks passed\n");
  return 0;
}
