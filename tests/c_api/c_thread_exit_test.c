/* Many short-lived threads, each touching every piece of kiln's per-thread state and then ending
 * (strict C11 + POSIX threads): the tokenizer's scratch (kiln_tokenize), the kernels' scratch on
 * the calling thread and on a thread pool's worker (a cache with two compute threads, created
 * and destroyed by the thread: a greedy generate), and the last-error message (a failing call).
 * Each round starts kThreadsPerRound threads at once and joins them. What it catches is what
 * happens as a thread ends: per-thread memory freed twice or after its storage (a crash, or a
 * heap error under AddressSanitizer or Windows' heap checks), or never freed (a leak that
 * LeakSanitizer reports). Every thread's greedy tokens must equal the main thread's.
 *
 *   c_thread_exit_test MODEL.gguf [ROUNDS]   (default 8) */
#define _POSIX_C_SOURCE 200809L
#include <kiln/kiln.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures = 0; /* the main thread's CHECKs; threads count in g_thread_failures */
#include "c_check.h"

enum { kThreadsPerRound = 4, kGenerated = 3, kMaxTokens = 64 };

static atomic_int g_thread_failures;

static const char kPrompt[] = "The quick brown fox jumps over the lazy dog, then naps.";

typedef struct {
  const kiln_model* model;
  int32_t tokens[kMaxTokens]; /* prompt tokens, then the generated ones */
  size_t n_tokens;
} run_result;

static int collect(int32_t token, const char* piece, size_t piece_len, void* user_data) {
  (void)piece;
  (void)piece_len;
  run_result* run = user_data;
  if (token >= 0 && run->n_tokens < kMaxTokens) run->tokens[run->n_tokens++] = token;
  return 0;
}

/* Tokenizes the prompt and generates kGenerated greedy tokens on a cache of its own (two compute
 * threads: the pool's worker starts and ends inside this call). Returns 0 on success. */
static int tokenize_and_generate(run_result* run) {
  run->n_tokens = 0;
  if (kiln_tokenize(run->model, kPrompt, strlen(kPrompt), KILN_TOKENIZE_ADD_SPECIAL, run->tokens,
                    kMaxTokens, &run->n_tokens) != KILN_OK)
    return -1;
  kiln_cache_params cache_params;
  kiln_cache_params_init(&cache_params, sizeof cache_params);
  cache_params.n_ctx = kMaxTokens;
  cache_params.n_threads = 2;
  kiln_cache* cache = NULL;
  if (kiln_cache_create(run->model, &cache_params, &cache) != KILN_OK) return -1;
  kiln_session* session = NULL;
  int ok = kiln_session_create(run->model, cache, NULL, &session) == KILN_OK &&
           kiln_session_append_tokens(session, run->tokens, run->n_tokens) == KILN_OK;
  if (ok) {
    kiln_generate_params params;
    kiln_generate_params_init(&params, sizeof params);
    params.max_tokens = kGenerated;
    params.callback = collect;
    params.user_data = run;
    kiln_generate_result result = {.struct_size = sizeof result};
    ok = kiln_session_generate(session, &params, &result) == KILN_OK;
  }
  kiln_session_destroy(session);
  kiln_cache_destroy(cache);
  return ok ? 0 : -1;
}

static const run_result* g_expected;

static void* short_lived_thread(void* arg) {
  const kiln_model* model = arg;
  /* The last-error message: a failing call stores one for this thread. */
  TCHECK(kiln_session_rewind(NULL, 1) == KILN_ERR_INVALID_ARGUMENT);
  TCHECK(strlen(kiln_last_error_message()) > 0);
  run_result run = {.model = model};
  TCHECK(tokenize_and_generate(&run) == 0);
  TCHECK(run.n_tokens == g_expected->n_tokens);
  TCHECK(memcmp(run.tokens, g_expected->tokens, run.n_tokens * sizeof run.tokens[0]) == 0);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: c_thread_exit_test MODEL.gguf [ROUNDS]\n");
    return 2;
  }
  const int rounds = argc > 2 ? atoi(argv[2]) : 8;
  kiln_model_params model_params;
  kiln_model_params_init(&model_params, sizeof model_params);
  model_params.path = argv[1];
  kiln_model* model = NULL;
  if (kiln_model_load(&model_params, &model) != KILN_OK) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], kiln_last_error_message());
    return 1;
  }
  static run_result expected;
  expected.model = model;
  CHECK(tokenize_and_generate(&expected) == 0);
  g_expected = &expected;

  int threads_ended = 0;
  for (int round = 0; round < rounds && g_failures == 0; ++round) {
    pthread_t threads[kThreadsPerRound];
    int started = 0;
    for (int i = 0; i < kThreadsPerRound; ++i)
      if (pthread_create(&threads[i], NULL, short_lived_thread, model) == 0) ++started;
    CHECK(started == kThreadsPerRound);
    for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
    threads_ended += started;
  }
  kiln_model_destroy(model);
  const int failures = g_failures + atomic_load(&g_thread_failures);
  printf("c_thread_exit_test: %d threads (and as many pool workers) ended, %d failures\n",
         threads_ended, failures);
  return failures == 0 ? 0 : 1;
}
