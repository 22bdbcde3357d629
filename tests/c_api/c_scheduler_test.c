/* The non-blocking C API (strict C11 + POSIX threads) on the default model (or argv[1]'s): submit
 * and poll with host-driven steps under a time budget, the worker thread, callbacks (what may and
 * may not be called from them), cancel of a queued, prefilling and decoding request, busy rules and
 * bad arguments, and blocking generates on several threads giving the text of sequential ones. */
#define _POSIX_C_SOURCE 200809L
#include <kiln/kiln.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_failures = 0;
#include "c_check.h"

/* Tokens per request: fewer under the sanitizers (ThreadSanitizer runs this test 5-15x slower). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
enum { kMaxTokens = 8 };
#else
enum { kMaxTokens = 16 };
#endif
enum { kSessions = 4, kTextCap = 4096 };

static const char* kPrompts[kSessions] = {
    "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSay hello in Spanish.<|im_end|>\n<|im_start|>assistant\n"};

typedef struct output {
  char text[kTextCap];
  size_t text_len;
  int32_t tokens[64];
  size_t n_tokens;
} output;

static void sleep_ms(long ms) {
  struct timespec t;
  t.tv_sec = ms / 1000;
  t.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&t, NULL);
}

static int collect(int32_t token, const char* piece, size_t len, void* user_data) {
  output* out = (output*)user_data;
  if (token >= 0 && out->n_tokens < 64) out->tokens[out->n_tokens++] = token;
  if (out->text_len + len <= kTextCap) {
    memcpy(out->text + out->text_len, piece, len);
    out->text_len += len;
  }
  return 0;
}

/* The reference: a blocking greedy generate per prompt, one after the other. */
static void generate_blocking(kiln_model* model, kiln_cache* cache, int i, output* out) {
  kiln_session* s = NULL;
  kiln_generate_params gp;
  kiln_generate_result gr;
  memset(out, 0, sizeof *out);
  CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
  CHECK(kiln_session_append_text(s, kPrompts[i], strlen(kPrompts[i]),
                                 KILN_TOKENIZE_PARSE_SPECIAL) == KILN_OK);
  kiln_generate_params_init(&gp, sizeof gp);
  gp.max_tokens = kMaxTokens;
  gp.callback = collect;
  gp.user_data = out;
  gr.struct_size = sizeof gr;
  CHECK(kiln_session_generate(s, &gp, &gr) == KILN_OK);
  kiln_session_destroy(s);
}

static kiln_request_params request(int i) {
  kiln_request_params rp;
  kiln_request_params_init(&rp, sizeof rp);
  rp.text = kPrompts[i];
  rp.text_len = strlen(kPrompts[i]);
  rp.text_flags = KILN_TOKENIZE_PARSE_SPECIAL;
  rp.max_tokens = kMaxTokens;
  return rp;
}

/* Polls into `out`; returns the result. */
static kiln_poll_result poll_into(kiln_session* s, output* out) {
  kiln_poll_result pr;
  memset(&pr, 0, sizeof pr);
  pr.struct_size = sizeof pr;
  CHECK(kiln_session_poll(s, out->text + out->text_len, kTextCap - out->text_len,
                          out->tokens + out->n_tokens, 64 - out->n_tokens, &pr) == KILN_OK);
  out->text_len += pr.text_len;
  out->n_tokens += pr.n_new_tokens;
  return pr;
}

static int same(const output* a, const output* b) {
  return a->n_tokens == b->n_tokens && a->text_len == b->text_len &&
         memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t)) == 0 &&
         memcmp(a->text, b->text, a->text_len) == 0;
}

static void test_bad_arguments(kiln_model* model, kiln_cache* cache) {
  kiln_session* s = NULL;
  kiln_request_params rp = request(0);
  kiln_poll_result pr;
  kiln_step_params sp;
  kiln_step_result sr;
  char text[8];
  memset(&pr, 0, sizeof pr);
  CHECK(kiln_request_params_init(NULL, sizeof rp) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_request_params_init(&rp, 4) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_step_params_init(&sp, sizeof sp) == KILN_OK);
  CHECK(sp.time_budget_ms == 0.0 && sp.step_tokens == 0);
  CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
  CHECK(kiln_session_submit(NULL, &rp) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_submit(s, NULL) == KILN_ERR_INVALID_ARGUMENT);
  rp = request(0);
  rp.struct_size = 0;
  CHECK(kiln_session_submit(s, &rp) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "kiln_request_params") != NULL);
  rp = request(0);
  rp.max_tokens = -1;
  CHECK(kiln_session_submit(s, &rp) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "max_tokens") != NULL);
  rp = request(0);
  rp.text = NULL;
  CHECK(kiln_session_submit(s, &rp) == KILN_ERR_INVALID_ARGUMENT);
  rp = request(0);
  rp.text_len = 0;
  CHECK(kiln_session_submit(s, &rp) == KILN_ERR_INVALID_ARGUMENT); /* empty session, no prompt */
  rp = request(0);
  {
    const int32_t bad = 1 << 30;
    rp.tokens = &bad;
    rp.n_tokens = 1;
    CHECK(kiln_session_submit(s, &rp) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_last_error_message(), "outside") != NULL);
  }
  /* Poll before any submit, and with bad buffers. */
  pr.struct_size = sizeof pr;
  CHECK(kiln_session_poll(s, text, sizeof text, NULL, 0, &pr) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_poll(NULL, text, sizeof text, NULL, 0, &pr) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_session_poll(s, NULL, 8, NULL, 0, &pr) == KILN_ERR_INVALID_ARGUMENT);
  pr.struct_size = 2;
  CHECK(kiln_session_poll(s, text, sizeof text, NULL, 0, &pr) == KILN_ERR_INVALID_ARGUMENT);
  /* Step arguments. */
  CHECK(kiln_cache_step(NULL, NULL, NULL) == KILN_ERR_INVALID_ARGUMENT);
  kiln_step_params_init(&sp, sizeof sp);
  sp.time_budget_ms = -1;
  CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "time_budget_ms") != NULL);
  sr.struct_size = sizeof sr;
  CHECK(kiln_cache_step(cache, NULL, &sr) == KILN_OK); /* nothing in flight */
  CHECK(sr.n_steps == 0 && sr.n_active == 0);
  CHECK(kiln_cache_start_worker(NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_cache_stop_worker(NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_cache_stop_worker(cache) == KILN_OK); /* none running: nothing to do */
  kiln_session_destroy(s);
}

/* Host-driven: all sessions submitted, then kiln_cache_step with a 5 ms budget per "frame"
 * until every poll reports done. The texts equal the blocking ones, and busy rules hold. */
static void test_host_steps(kiln_model* model, kiln_cache* cache, const output* expected) {
  kiln_session* s[kSessions];
  output out[kSessions];
  int done[kSessions] = {0};
  int n_done = 0, frames = 0;
  kiln_step_params sp;
  kiln_step_result sr;
  kiln_generate_params gp;
  kiln_generate_result gr;
  kiln_step_params_init(&sp, sizeof sp);
  sp.time_budget_ms = 5.0;
  sr.struct_size = sizeof sr;
  kiln_generate_params_init(&gp, sizeof gp);
  gr.struct_size = sizeof gr;
  for (int i = 0; i < kSessions; ++i) {
    kiln_request_params rp = request(i);
    memset(&out[i], 0, sizeof out[i]);
    CHECK(kiln_session_create(model, cache, NULL, &s[i]) == KILN_OK);
    CHECK(kiln_session_submit(s[i], &rp) == KILN_OK);
  }
  /* In flight: other calls are busy, cancel and n_tokens are not. */
  CHECK(kiln_session_generate(s[0], &gp, &gr) == KILN_ERR_BUSY);
  {
    kiln_request_params rp = request(0);
    CHECK(kiln_session_submit(s[0], &rp) == KILN_ERR_BUSY);
  }
  CHECK(kiln_session_n_tokens(s[0]) > 0);
  while (n_done < kSessions && frames < 10000) {
    ++frames;
    CHECK(kiln_cache_step(cache, &sp, &sr) == KILN_OK);
    CHECK(sr.n_steps >= 1);
    for (int i = 0; i < kSessions; ++i) {
      if (done[i]) continue;
      kiln_poll_result pr = poll_into(s[i], &out[i]);
      if (pr.done) {
        CHECK(pr.status == KILN_OK);
        CHECK(pr.n_tokens == kMaxTokens || pr.stop_reason == KILN_STOP_EOG);
        done[i] = 1;
        ++n_done;
      }
    }
  }
  CHECK(n_done == kSessions);
  for (int i = 0; i < kSessions; ++i) {
    CHECK(same(&out[i], &expected[i]));
    /* Done: the session takes calls again. */
    gp.max_tokens = 1;
    CHECK(kiln_session_generate(s[i], &gp, &gr) == KILN_OK);
    kiln_session_destroy(s[i]);
  }
  printf("host steps: %d sessions done in %d frames\n", kSessions, frames);
}

typedef struct callback_state {
  kiln_cache* cache;
  kiln_session* other; /* a session without a request */
  output out;
  atomic_int done_calls; /* incremented last by on_done: what the callbacks wrote is visible */
  kiln_status done_status;
  kiln_stop_reason done_reason;
  int32_t done_tokens;
  int step_from_callback;     /* status of kiln_cache_step inside the callback */
  int generate_from_callback; /* status of a blocking generate inside the callback */
  int stop_after;             /* return non-zero after this many tokens (0: never) */
} callback_state;

static int on_token(int32_t token, const char* piece, size_t len, void* user_data) {
  callback_state* st = (callback_state*)user_data;
  kiln_generate_params gp;
  kiln_generate_result gr;
  collect(token, piece, len, &st->out);
  st->step_from_callback = kiln_cache_step(st->cache, NULL, NULL);
  kiln_generate_params_init(&gp, sizeof gp);
  gr.struct_size = sizeof gr;
  st->generate_from_callback = kiln_session_generate(st->other, &gp, &gr);
  return st->stop_after > 0 && (int)st->out.n_tokens >= st->stop_after;
}

static void on_done(kiln_session* session, kiln_status status, kiln_stop_reason reason,
                    int32_t n_tokens, void* user_data) {
  callback_state* st = (callback_state*)user_data;
  kiln_poll_result pr;
  st->done_status = status;
  st->done_reason = reason;
  st->done_tokens = n_tokens;
  memset(&pr, 0, sizeof pr);
  pr.struct_size = sizeof pr;
  /* Poll is allowed from a callback. */
  CHECK(kiln_session_poll(session, NULL, 0, NULL, 0, &pr) == KILN_OK);
  atomic_fetch_add(&st->done_calls, 1);
}

/* The worker steps; results come by callback on the worker thread. */
static void test_worker_and_callbacks(kiln_model* model, kiln_cache* cache,
                                      const output* expected) {
  kiln_session* s = NULL;
  callback_state st;
  kiln_request_params rp = request(1);
  memset(&st, 0, sizeof st);
  atomic_init(&st.done_calls, 0);
  st.cache = cache;
  CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
  CHECK(kiln_session_create(model, cache, NULL, &st.other) == KILN_OK);
  CHECK(kiln_session_append_text(st.other, "Hello", 5, 0) == KILN_OK);
  rp.on_token = on_token;
  rp.on_done = on_done;
  rp.user_data = &st;
  CHECK(kiln_cache_start_worker(cache) == KILN_OK);
  CHECK(kiln_cache_start_worker(cache) == KILN_OK); /* already running: no-op */
  CHECK(kiln_session_submit(s, &rp) == KILN_OK);
  for (int i = 0; i < 60000 && atomic_load(&st.done_calls) == 0; ++i) sleep_ms(1);
  CHECK(atomic_load(&st.done_calls) == 1);
  CHECK(st.done_status == KILN_OK);
  CHECK(st.done_tokens == kMaxTokens || st.done_reason == KILN_STOP_EOG);
  CHECK(same(&st.out, &expected[1]));
  CHECK(st.step_from_callback == KILN_ERR_BUSY);
  CHECK(st.generate_from_callback == KILN_ERR_BUSY);

  /* A callback that stops after 3 tokens: KILN_STOP_CALLBACK. */
  memset(&st.out, 0, sizeof st.out);
  atomic_store(&st.done_calls, 0);
  st.stop_after = 3;
  rp = request(2);
  rp.on_token = on_token;
  rp.on_done = on_done;
  rp.user_data = &st;
  CHECK(kiln_session_submit(s, &rp) == KILN_OK); /* on_done ended the previous request */
  for (int i = 0; i < 60000 && atomic_load(&st.done_calls) == 0; ++i) sleep_ms(1);
  CHECK(atomic_load(&st.done_calls) == 1);
  CHECK(st.done_reason == KILN_STOP_CALLBACK);
  CHECK(st.done_tokens == 3);
  CHECK(st.out.n_tokens == 3);

  /* A blocking generate while the worker runs waits for the worker's steps. */
  {
    output out;
    generate_blocking(model, cache, 3, &out);
    CHECK(same(&out, &expected[3]));
  }
  CHECK(kiln_cache_stop_worker(cache) == KILN_OK);
  kiln_session_destroy(st.other);
  kiln_session_destroy(s);
}

static void test_cancel(kiln_model* model, kiln_cache* cache) {
  kiln_session* s = NULL;
  kiln_request_params rp = request(0);
  kiln_poll_result pr;
  output out;
  kiln_step_params sp;
  char long_prompt[6000];
  size_t len = 0;
  kiln_step_params_init(&sp, sizeof sp);
  sp.step_tokens = 64;
  CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
  /* Queued. */
  CHECK(kiln_session_submit(s, &rp) == KILN_OK);
  CHECK(kiln_session_cancel(s) == KILN_OK);
  memset(&out, 0, sizeof out);
  do {
    CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_OK);
    pr = poll_into(s, &out);
  } while (!pr.done);
  CHECK(pr.status == KILN_ERR_CANCELLED);
  CHECK(kiln_session_n_tokens(s) == 0);
  /* Prefilling: a long prompt, cancelled after one 64-token step. */
  while (len + 40 < sizeof long_prompt) {
    memcpy(long_prompt + len, "The quick brown fox jumps over the dog. ", 40);
    len += 40;
  }
  rp = request(0);
  rp.text = long_prompt;
  rp.text_len = len;
  rp.text_flags = 0;
  CHECK(kiln_session_submit(s, &rp) == KILN_OK);
  CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_OK);
  CHECK(kiln_session_cancel(s) == KILN_OK);
  do {
    CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_OK);
    pr = poll_into(s, &out);
  } while (!pr.done);
  CHECK(pr.status == KILN_ERR_CANCELLED);
  CHECK(strstr(kiln_last_error_message(), "cancelled") != NULL);
  CHECK(kiln_session_n_tokens(s) == 0);
  /* Decoding: after 2 tokens; they stay. */
  rp = request(0);
  rp.max_tokens = 100;
  CHECK(kiln_session_submit(s, &rp) == KILN_OK);
  memset(&out, 0, sizeof out);
  do {
    CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_OK);
    pr = poll_into(s, &out);
  } while (pr.n_tokens < 2 && !pr.done);
  CHECK(kiln_session_cancel(s) == KILN_OK);
  do {
    CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_OK);
    pr = poll_into(s, &out);
  } while (!pr.done);
  CHECK(pr.status == KILN_OK);
  CHECK(pr.stop_reason == KILN_STOP_CANCELLED);
  CHECK(pr.n_tokens >= 2 && pr.n_tokens < 100);
  kiln_session_destroy(s);

  /* Destroying a session with a request in flight cancels it. */
  CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
  rp = request(0);
  CHECK(kiln_session_submit(s, &rp) == KILN_OK);
  CHECK(kiln_cache_step(cache, &sp, NULL) == KILN_OK);
  kiln_session_destroy(s);
  {
    kiln_step_result sr;
    sr.struct_size = sizeof sr;
    CHECK(kiln_cache_step(cache, &sp, &sr) == KILN_OK);
    CHECK(sr.n_active == 0);
  }
}

typedef struct thread_job {
  kiln_model* model;
  kiln_cache* cache;
  int index;
  output out;
} thread_job;

static void* generate_thread(void* arg) {
  thread_job* job = (thread_job*)arg;
  generate_blocking(job->model, job->cache, job->index, &job->out);
  return NULL;
}

static void test_concurrent_blocking(kiln_model* model, kiln_cache* cache, const output* expected) {
  pthread_t threads[kSessions];
  thread_job jobs[kSessions];
  for (int i = 0; i < kSessions; ++i) {
    jobs[i].model = model;
    jobs[i].cache = cache;
    jobs[i].index = i;
    CHECK(pthread_create(&threads[i], NULL, generate_thread, &jobs[i]) == 0);
  }
  for (int i = 0; i < kSessions; ++i) pthread_join(threads[i], NULL);
  for (int i = 0; i < kSessions; ++i) CHECK(same(&jobs[i].out, &expected[i]));
}

/* kiln_cache_params.step_tokens: default 512, checked, and a step of a cache with 16 computes 16
 * prompt tokens; a struct from before the field (the ABI 1 baseline) gets the default. */
static void test_cache_step_tokens(kiln_model* model) {
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  kiln_session* s = NULL;
  kiln_request_params rp;
  kiln_step_result sr;
  char text[512] = "";
  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  CHECK(cp.step_tokens == 512);
  cp.n_threads = 2;
  cp.n_ctx = 512;
  cp.step_tokens = 0;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "step_tokens") != NULL);
  cp.struct_size = (uint32_t)offsetof(kiln_cache_params, step_tokens);
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK); /* step_tokens past it: the default */
  kiln_cache_destroy(cache);
  cache = NULL;
  cp.struct_size = sizeof cp;
  cp.step_tokens = 16;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  for (int i = 0; i < 20; ++i) strcat(text, "the quick brown fox ");
  CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
  kiln_request_params_init(&rp, sizeof rp);
  rp.text = text;
  rp.text_len = strlen(text);
  rp.max_tokens = 1;
  CHECK(kiln_session_submit(s, &rp) == KILN_OK);
  sr.struct_size = sizeof sr;
  CHECK(kiln_cache_step(cache, NULL, &sr) == KILN_OK);
  CHECK(sr.n_steps == 1 && sr.n_tokens == 16 && sr.n_active == 1);
  kiln_session_destroy(s);
  kiln_cache_destroy(cache);
}

/* kiln_cache_params.mla_prefill: default absorbed, a value outside kiln_mla_prefill rejected
 * with a message naming the field, a struct from before the field gets the default, and measured
 * is accepted on a model without MLA (where it changes nothing: the same logits bitwise). The
 * effect on an MLA model: tests/c_api/mla_prefill_test.sh. */
static void test_cache_mla_prefill(kiln_model* model) {
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  CHECK(cp.mla_prefill == KILN_MLA_PREFILL_ABSORBED);
  cp.n_threads = 2;
  cp.n_ctx = 256;
  cp.mla_prefill = (kiln_mla_prefill)7;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  CHECK(strstr(kiln_last_error_message(), "mla_prefill 7") != NULL);
  cp.mla_prefill = (kiln_mla_prefill)-1;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  cp.struct_size = (uint32_t)offsetof(kiln_cache_params, mla_prefill);
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK); /* the bad value past it: ignored */
  kiln_cache_destroy(cache);
  cache = NULL;
  cp.struct_size = sizeof cp;
  float last[2][8];
  for (int measured = 0; measured < 2; ++measured) {
    kiln_session* s = NULL;
    const float* logits = NULL;
    int32_t n_vocab = 0;
    cp.mla_prefill = measured ? KILN_MLA_PREFILL_MEASURED : KILN_MLA_PREFILL_ABSORBED;
    CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
    if (cache == NULL) return;
    CHECK(kiln_session_create(model, cache, NULL, &s) == KILN_OK);
    CHECK(kiln_session_append_text(s, "the quick brown fox", 19, 0) == KILN_OK);
    CHECK(kiln_session_get_logits(s, &logits, &n_vocab) == KILN_OK && n_vocab >= 8);
    if (logits != NULL) memcpy(last[measured], logits, sizeof last[measured]);
    kiln_session_destroy(s);
    kiln_cache_destroy(cache);
    cache = NULL;
  }
  CHECK(memcmp(last[0], last[1], sizeof last[0]) == 0);
}

/* kiln_cache_params.sliding_window_sessions (no longer read): default 0, a negative value still
 * rejected naming the field, a struct from before the field gets the default, a positive value
 * accepted; swa_full: default 0. On a model without sliding-window layers (this one) neither
 * changes anything: no sliding blocks in the stats. Release on a gemma3 model:
 * gemma3_forward_test (EngineSlidingReleaseKeepsSessionsBitwise). */
static void test_cache_sliding_window_params(kiln_model* model) {
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  kiln_cache_stats st;
  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  CHECK(cp.sliding_window_sessions == 0 && cp.swa_full == 0);
  cp.n_threads = 2;
  cp.n_ctx = 256;
  cp.sliding_window_sessions = -1;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  CHECK(strstr(kiln_last_error_message(), "sliding_window_sessions -1") != NULL);
  cp.struct_size = (uint32_t)offsetof(kiln_cache_params, sliding_window_sessions);
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK); /* the bad value past it: ignored */
  kiln_cache_destroy(cache);
  cache = NULL;
  cp.struct_size = sizeof cp;
  cp.sliding_window_sessions = 2;
  cp.swa_full = 1;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  memset(&st, 0xff, sizeof st);
  st.struct_size = sizeof st;
  CHECK(kiln_cache_get_stats(cache, &st) == KILN_OK);
  CHECK(st.sliding_blocks_total == 0 && st.sliding_blocks_used == 0);
  CHECK(st.sliding_blocks_released == 0 && st.sliding_block_bytes == 0);
  CHECK(st.kv_bytes_in_use == (size_t)st.blocks_used * st.block_bytes);
  kiln_cache_destroy(cache);
}

/* kiln_cache_params.pin_threads: default 0; set, a 2-thread CPU cache says its workers are
 * pinned and generates what an unpinned one does (`expected`: prompt 0's greedy output). */
static void test_cache_pin_threads(kiln_model* model, const output* expected) {
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  output out;
  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  CHECK(cp.pin_threads == 0);
  cp.n_threads = 2;
  cp.n_ctx = 256;
  cp.pin_threads = 1;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  CHECK(strstr(kiln_cache_backend(cache), "workers pinned") != NULL);
  generate_blocking(model, cache, 0, &out);
  CHECK(out.n_tokens == expected->n_tokens);
  CHECK(memcmp(out.tokens, expected->tokens, out.n_tokens * sizeof out.tokens[0]) == 0);
  kiln_cache_destroy(cache);
  cache = NULL;
  cp.struct_size = (uint32_t)offsetof(kiln_cache_params, pin_threads); /* before the field */
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  if (cache == NULL) return;
  CHECK(strstr(kiln_cache_backend(cache), "pinned") == NULL);
  kiln_cache_destroy(cache);
}

/* argv[1]: the model (default: the default model in KILN_MODEL_DIR or ~/.cache/kiln). */
int main(int argc, char** argv) {
  char path[1024];
  const char* dir = getenv("KILN_MODEL_DIR");
  const char* home = getenv("HOME");
  kiln_model_params mp;
  kiln_model* model = NULL;
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  output expected[kSessions];
  kiln_model_params_init(&mp, sizeof mp);
  kiln_cache_params_init(&cp, sizeof cp);
  if (argc > 1) {
    snprintf(path, sizeof path, "%s", argv[1]);
  } else if (dir && *dir) {
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
  for (int i = 0; i < kSessions; ++i) generate_blocking(model, cache, i, &expected[i]);
  for (int i = 0; i < kSessions; ++i) CHECK(expected[i].n_tokens > 0);
  test_bad_arguments(model, cache);
  test_cache_step_tokens(model);
  test_cache_mla_prefill(model);
  test_cache_sliding_window_params(model);
  test_cache_pin_threads(model, &expected[0]);
  test_host_steps(model, cache, expected);
  test_worker_and_callbacks(model, cache, expected);
  test_cancel(model, cache);
  test_concurrent_blocking(model, cache, expected);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  if (g_failures) {
    fprintf(stderr, "c_scheduler_test: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("c_scheduler_test: all checks passed\n");
  return 0;
}
