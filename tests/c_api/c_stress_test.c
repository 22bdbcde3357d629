/* Stress test of the C API's thread rules (strict C11 + POSIX threads), run under ThreadSanitizer
 * and AddressSanitizer by scripts/test.sh: 64 session slots on one cache, 8 host threads doing
 * random operations for a given time (create, submit, poll, blocking generate, fork, cancel,
 * save, restore into a new session, destroy; stepping the cache, starting and stopping its
 * worker; cancels and getters from threads that do not own the session). Every request that
 * ends without a cancel must give exactly the tokens of a solo run: the session's history
 * (prompt, sampler, n-gram strategy, the max_tokens of each generate since) replayed alone, one
 * generate after the other, on a separate cache.
 *
 *   c_stress_test MODEL.gguf [SECONDS]   (default: $KILN_STRESS_SECONDS, else 5)
 *
 * Ownership: a slot's claim mutex is held by the one thread that uses the session; other threads
 * only call what the API allows from any thread (cancel, n_tokens) and getters that must answer
 * KILN_OK or KILN_ERR_BUSY, under the slot's life lock, which a destroy takes exclusively. */
#define _POSIX_C_SOURCE 200809L
#include <kiln/kiln.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_failures = 0; /* only the main thread's CHECKs; workers count in g_thread_failures */
#include "c_check.h"

enum {
  kSlots = 64,
  kThreads = 8,
  kPrompts = 8,
  kModes = 3,        /* 0 greedy, 1 and 2 seeded sampling */
  kMaxChunks = 8,    /* generates in one session's history */
  kMaxGenerate = 12, /* tokens per generate */
  kMaxTokens = 512,  /* buffer sizes */
  kSavedStates = 16,
  kNCtx = 256,
  kSessionLimit = 160 /* a longer session is destroyed instead of continued */
};

static atomic_int g_thread_failures;

/* Operation counts, printed at the end. */
enum op_kind {
  kOpCreate,
  kOpSubmit,
  kOpPoll,
  kOpPollDone,
  kOpGenerate,
  kOpFork,
  kOpCancelOwn,
  kOpCancelIdle,
  kOpCancelForeign,
  kOpSave,
  kOpRestore,
  kOpDestroy,
  kOpDestroyInFlight,
  kOpStep,
  kOpWorkerStart,
  kOpWorkerStop,
  kOpBusyChecked,
  kOpPeek,
  kOpPeekBusy,
  kOpBusyExcused,
  kOpCacheFull,
  kOpCompared,
  kOpNotCompared,
  kOpCount
};
static const char* kOpNames[kOpCount] = {
    "create",         "submit",       "poll",           "poll_done",     "generate",      "fork",
    "cancel_own",     "cancel_idle",  "cancel_foreign", "save",          "restore",       "destroy",
    "destroy_flight", "step",         "worker_start",   "worker_stop",   "busy_asserted", "peek",
    "peek_busy",      "busy_excused", "cache_full",     "compared_solo", "not_compared"};
static atomic_long g_ops[kOpCount];
static void count(enum op_kind k) { atomic_fetch_add(&g_ops[k], 1); }

/* What a session holds, enough to replay it alone: prompt, sampling mode, n-gram strategy and
 * the max_tokens of each generate. valid 0: unknown (a cancel or an error cut something). */
typedef struct history {
  int valid;
  int prompt, mode, ngram;
  int prompted; /* the prompt is in the session */
  int n_chunks;
  int32_t chunks[kMaxChunks];
  char origin[24]; /* how the session came to be, for a mismatch's report: "c", then "f" per fork
                      and "r0"/"r1" per restore (without/with K/V) */
} history;

static void note_origin(history* h, const char* event) {
  const size_t used = strlen(h->origin);
  if (used + strlen(event) < sizeof h->origin) strcat(h->origin, event);
}

/* Every read that checks a result against a foreign thread's overlapping call: a foreign cancel
 * may end the owner's call, a foreign getter may make it fail with KILN_ERR_BUSY. */
typedef struct foreign_marks {
  unsigned long cancels, peeks;
  int cancel_active, peek_active;
} foreign_marks;

typedef struct slot {
  pthread_mutex_t claim;
  pthread_rwlock_t life; /* exclusive around create and destroy; shared by foreign calls */
  kiln_session* session;
  kiln_strategy* strategy; /* owned here (NULL for forks, whose clone the session owns) */
  history h;
  /* The request in flight (submitted, poll has not yet reported done). */
  int in_flight, max_tokens, own_cancel;
  foreign_marks at_submit;
  int32_t got[kMaxTokens];
  size_t n_got;
  atomic_ulong cancels, peeks;
  atomic_int cancel_active, peek_active;
} slot;

typedef struct saved_state {
  void* data;
  size_t size;
  history h;
} saved_state;

static kiln_model* g_model;
static kiln_cache* g_cache;     /* the stress cache */
static kiln_cache* g_ref_cache; /* solo replays, one at a time */
static pthread_mutex_t g_ref_mu = PTHREAD_MUTEX_INITIALIZER;
static kiln_sampler* g_samplers[kModes]; /* [0] NULL: greedy */
static int32_t g_prompt_tokens[kPrompts][48];
static size_t g_prompt_len[kPrompts];
static const char* kTextPrompts[kPrompts / 2] = {"the cat sat on the mat", "hello world, hello",
                                                 "once upon a time there was",
                                                 "a b c d e f g h i j k"};
static slot g_slots[kSlots];
static saved_state g_saved[kSavedStates];
static pthread_mutex_t g_saved_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_stop;
static struct timespec g_start;

static uint64_t next_random(uint64_t* state) { /* xorshift64* */
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 2685821657736338717ull;
}
static int pick(uint64_t* rng, int n) { return (int)(next_random(rng) % (uint64_t)n); }

static double seconds_since_start(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - g_start.tv_sec) + (double)(t.tv_nsec - g_start.tv_nsec) * 1e-9;
}

static kiln_strategy* new_ngram(void) {
  kiln_ngram_params np;
  kiln_strategy* strategy = NULL;
  kiln_ngram_params_init(&np, sizeof np);
  np.min_ngram = 1;
  np.max_draft = 4;
  np.fixed_pass_cost_beta = 0.25; /* draft lengths, and so seeded text, independent of timing */
  TCHECK(kiln_strategy_create_ngram(&np, &strategy) == KILN_OK);
  return strategy;
}

/* The prompt appended by a blocking call: even prompts as text, odd ones as token ids. */
static kiln_status append_prompt(kiln_session* s, int prompt) {
  if (prompt % 2 == 0) {
    const char* text = kTextPrompts[prompt / 2];
    return kiln_session_append_text(s, text, strlen(text), 0);
  }
  return kiln_session_append_tokens(s, g_prompt_tokens[prompt], g_prompt_len[prompt]);
}

typedef struct collected {
  int32_t tokens[kMaxTokens];
  size_t n;
} collected;

static int collect_token(int32_t token, const char* piece, size_t len, void* user_data) {
  collected* c = (collected*)user_data;
  (void)piece;
  (void)len;
  if (token >= 0 && c->n < kMaxTokens) c->tokens[c->n++] = token;
  return 0;
}

/* The solo run of `h` on the reference cache: the tokens and stop reason of its last generate,
 * and the session's speculative metrics after it. */
static int replay(const history* h, collected* out, kiln_stop_reason* reason,
                  kiln_spec_metrics* metrics) {
  kiln_session* s = NULL;
  kiln_strategy* strategy = NULL;
  int ok = 1;
  pthread_mutex_lock(&g_ref_mu);
  ok = kiln_session_create(g_model, g_ref_cache, g_samplers[h->mode], &s) == KILN_OK;
  if (ok && h->ngram) {
    strategy = new_ngram();
    ok = kiln_session_set_strategy(s, strategy) == KILN_OK;
  }
  ok = ok && append_prompt(s, h->prompt) == KILN_OK;
  for (int c = 0; ok && c < h->n_chunks; ++c) {
    kiln_generate_params gp;
    kiln_generate_result gr;
    kiln_generate_params_init(&gp, sizeof gp);
    gp.max_tokens = h->chunks[c];
    gp.callback = collect_token;
    gp.user_data = out;
    gr.struct_size = sizeof gr;
    out->n = 0;
    ok = kiln_session_generate(s, &gp, &gr) == KILN_OK;
    *reason = gr.stop_reason;
  }
  metrics->struct_size = sizeof *metrics;
  ok = ok && kiln_session_get_spec_metrics(s, metrics) == KILN_OK;
  kiln_session_destroy(s);
  kiln_strategy_destroy(strategy);
  pthread_mutex_unlock(&g_ref_mu);
  TCHECK(ok);
  return ok;
}

/* "a b c" of values[0, n) into out (truncated to its size). */
static void join_ints(const int32_t* values, size_t n, char* out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n && used < size; ++i) {
    const int w = snprintf(out + used, size - used, i == 0 ? "%d" : " %d", (int)values[i]);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* Compares the last generate of slot `sl`'s history (tokens got[0, n_got), stop reason) with its
 * solo run; for a session created here (not a fork or a restore, whose decoders count from
 * zero) also the speculative metrics, which differ as soon as the drafts do, before the tokens
 * may. */
static void compare_with_solo(slot* sl, const int32_t* got, size_t n_got, kiln_stop_reason reason,
                              const char* how) {
  const history* h = &sl->h;
  collected expected;
  kiln_stop_reason expected_reason = KILN_STOP_MAX_TOKENS;
  kiln_spec_metrics solo_metrics, metrics;
  int metrics_differ = 0;
  expected.n = 0;
  if (!replay(h, &expected, &expected_reason, &solo_metrics)) return;
  count(kOpCompared);
  metrics.struct_size = sizeof metrics;
  if (strcmp(h->origin, "c") == 0 &&
      kiln_session_get_spec_metrics(sl->session, &metrics) == KILN_OK) {
    metrics_differ =
        metrics.steps != solo_metrics.steps || metrics.drafted != solo_metrics.drafted ||
        metrics.accepted != solo_metrics.accepted || metrics.generated != solo_metrics.generated;
  }
  if (metrics_differ) {
    fprintf(stderr,
            "MISMATCH (%s, speculative metrics): prompt %d mode %d ngram %d chunks %d: steps %lld "
            "drafted %lld accepted %lld generated %lld, solo %lld %lld %lld %lld\n",
            how, h->prompt, h->mode, h->ngram, h->n_chunks, (long long)metrics.steps,
            (long long)metrics.drafted, (long long)metrics.accepted, (long long)metrics.generated,
            (long long)solo_metrics.steps, (long long)solo_metrics.drafted,
            (long long)solo_metrics.accepted, (long long)solo_metrics.generated);
    atomic_fetch_add(&g_thread_failures, 1);
  }
  if (expected.n != n_got || memcmp(expected.tokens, got, n_got * sizeof(int32_t)) != 0 ||
      expected_reason != reason) {
    char chunks[8 * kMaxChunks + 1], got_text[8 * kMaxTokens + 1], solo_text[8 * kMaxTokens + 1];
    join_ints(h->chunks, (size_t)h->n_chunks, chunks, sizeof chunks);
    join_ints(got, n_got, got_text, sizeof got_text);
    join_ints(expected.tokens, expected.n, solo_text, sizeof solo_text);
    fprintf(stderr,
            "MISMATCH (%s): prompt %d mode %d ngram %d origin %s chunks [%s]: tokens [%s] reason "
            "%d, solo [%s] reason %d\n",
            how, h->prompt, h->mode, h->ngram, h->origin, chunks, got_text, (int)reason, solo_text,
            (int)expected_reason);
    atomic_fetch_add(&g_thread_failures, 1);
  }
}

static foreign_marks marks(slot* sl) {
  foreign_marks m;
  /* Counts before activity (see overlapped): a foreign call either bumped its count after this
   * read, or was still active when the activity was read. */
  m.cancels = atomic_load(&sl->cancels);
  m.peeks = atomic_load(&sl->peeks);
  m.cancel_active = atomic_load(&sl->cancel_active);
  m.peek_active = atomic_load(&sl->peek_active);
  return m;
}
static int cancel_overlapped(slot* sl, const foreign_marks* before) {
  return before->cancel_active > 0 || atomic_load(&sl->cancels) != before->cancels;
}
static int peek_overlapped(slot* sl, const foreign_marks* before) {
  return before->peek_active > 0 || atomic_load(&sl->peeks) != before->peeks;
}

/* A status of the owner's call that a foreign call may explain (checked, counted). Returns 1
 * when the call failed and changed nothing (BUSY from an overlapping getter). */
static int busy_excused(slot* sl, kiln_status st, const foreign_marks* before) {
  if (st != KILN_ERR_BUSY) return 0;
  TCHECK(peek_overlapped(sl, before));
  count(kOpBusyExcused);
  return 1;
}

static void set_session(slot* sl, kiln_session* s, kiln_strategy* strategy) {
  pthread_rwlock_wrlock(&sl->life);
  sl->session = s;
  sl->strategy = strategy;
  pthread_rwlock_unlock(&sl->life);
}

static void destroy_slot(slot* sl) {
  kiln_session* s = sl->session;
  kiln_strategy* strategy = sl->strategy;
  if (sl->in_flight) count(kOpDestroyInFlight);
  pthread_rwlock_wrlock(&sl->life);
  sl->session = NULL;
  sl->strategy = NULL;
  kiln_session_destroy(s); /* cancels a request in flight */
  pthread_rwlock_unlock(&sl->life);
  kiln_strategy_destroy(strategy);
  sl->in_flight = 0;
  memset(&sl->h, 0, sizeof sl->h);
  count(kOpDestroy);
}

static void op_create(slot* sl, uint64_t* rng) {
  kiln_session* s = NULL;
  kiln_strategy* strategy = NULL;
  history h;
  memset(&h, 0, sizeof h);
  h.valid = 1;
  h.prompt = pick(rng, kPrompts);
  h.mode = pick(rng, kModes);
  h.ngram = pick(rng, 2);
  note_origin(&h, "c");
  TCHECK(kiln_session_create(g_model, g_cache, g_samplers[h.mode], &s) == KILN_OK);
  if (s == NULL) return;
  if (h.ngram) {
    strategy = new_ngram();
    TCHECK(kiln_session_set_strategy(s, strategy) == KILN_OK);
  }
  sl->h = h;
  sl->in_flight = 0;
  set_session(sl, s, strategy);
  count(kOpCreate);
}

static void op_submit(slot* sl, uint64_t* rng) {
  kiln_request_params rp;
  const int max_tokens = 1 + pick(rng, kMaxGenerate);
  foreign_marks before;
  kiln_status st;
  kiln_request_params_init(&rp, sizeof rp);
  if (!sl->h.prompted) {
    if (sl->h.prompt % 2 == 0) {
      rp.text = kTextPrompts[sl->h.prompt / 2];
      rp.text_len = strlen(rp.text);
    } else {
      rp.tokens = g_prompt_tokens[sl->h.prompt];
      rp.n_tokens = g_prompt_len[sl->h.prompt];
    }
  }
  rp.max_tokens = max_tokens;
  before = marks(sl);
  st = kiln_session_submit(sl->session, &rp);
  if (busy_excused(sl, st, &before)) return;
  TCHECK(st == KILN_OK);
  if (st != KILN_OK) return;
  sl->in_flight = 1;
  sl->max_tokens = max_tokens;
  sl->own_cancel = 0;
  sl->at_submit = before;
  sl->n_got = 0;
  count(kOpSubmit);
}

/* Ends the history's bookkeeping of a finished generate: compared with the solo run, or the
 * history becomes unknown. */
static void finish_generate(slot* sl, kiln_status st, kiln_stop_reason reason, int cancelled,
                            int max_tokens, const int32_t* got, size_t n_got, const char* how) {
  if (st == KILN_ERR_CACHE_FULL) count(kOpCacheFull);
  if (cancelled || sl->h.n_chunks == kMaxChunks || !sl->h.valid) {
    TCHECK(st == KILN_OK || st == KILN_ERR_CANCELLED || st == KILN_ERR_CACHE_FULL);
    if (st == KILN_OK) sl->h.prompted = 1;
    sl->h.valid = 0;
    count(kOpNotCompared);
    return;
  }
  TCHECK(st == KILN_OK || st == KILN_ERR_CACHE_FULL);
  TCHECK(reason != KILN_STOP_CANCELLED || st != KILN_OK);
  if (st != KILN_OK) {
    sl->h.valid = 0;
    count(kOpNotCompared);
    return;
  }
  sl->h.prompted = 1;
  sl->h.chunks[sl->h.n_chunks++] = max_tokens;
  compare_with_solo(sl, got, n_got, reason, how);
}

static void op_poll(slot* sl, uint64_t* rng) {
  char text[64];
  kiln_poll_result pr;
  memset(&pr, 0, sizeof pr);
  pr.struct_size = sizeof pr;
  /* Small random capacities: output stays queued across polls. */
  const size_t token_cap = (size_t)(1 + pick(rng, 8));
  TCHECK(kiln_session_poll(sl->session, text, (size_t)pick(rng, (int)sizeof text),
                           sl->got + sl->n_got, sl->n_got + token_cap <= kMaxTokens ? token_cap : 0,
                           &pr) == KILN_OK);
  sl->n_got += pr.n_new_tokens;
  count(kOpPoll);
  if (!pr.done) return;
  count(kOpPollDone);
  sl->in_flight = 0;
  TCHECK(pr.status != KILN_OK || pr.n_tokens == (int32_t)sl->n_got ||
         (pr.stop_reason == KILN_STOP_EOG && pr.n_tokens == (int32_t)sl->n_got + 1));
  finish_generate(sl, pr.status, pr.stop_reason,
                  sl->own_cancel || cancel_overlapped(sl, &sl->at_submit), sl->max_tokens, sl->got,
                  sl->n_got, "submit+poll");
}

static void op_generate(slot* sl, uint64_t* rng) {
  kiln_generate_params gp;
  kiln_generate_result gr;
  collected got;
  const int max_tokens = 1 + pick(rng, kMaxGenerate);
  const foreign_marks before = marks(sl);
  kiln_status st = KILN_OK;
  got.n = 0;
  if (!sl->h.prompted) {
    st = append_prompt(sl->session, sl->h.prompt);
    if (busy_excused(sl, st, &before)) return;
    if (st != KILN_OK) {
      /* All or nothing: a cancelled or refused append leaves the session as it was. */
      TCHECK(st == KILN_ERR_CACHE_FULL ||
             (st == KILN_ERR_CANCELLED && cancel_overlapped(sl, &before)));
      if (st == KILN_ERR_CACHE_FULL) count(kOpCacheFull);
      return;
    }
    sl->h.prompted = 1;
  }
  kiln_generate_params_init(&gp, sizeof gp);
  gp.max_tokens = max_tokens;
  gp.callback = collect_token;
  gp.user_data = &got;
  gr.struct_size = sizeof gr;
  gr.stop_reason = KILN_STOP_MAX_TOKENS;
  st = kiln_session_generate(sl->session, &gp, &gr);
  if (busy_excused(sl, st, &before)) return;
  count(kOpGenerate);
  /* An end-of-generation token is kept in the session but not streamed. */
  TCHECK(st != KILN_OK || gr.n_tokens == (int32_t)got.n ||
         (gr.stop_reason == KILN_STOP_EOG && gr.n_tokens == (int32_t)got.n + 1));
  finish_generate(sl, st, gr.stop_reason, cancel_overlapped(sl, &before), max_tokens, got.tokens,
                  got.n, "blocking generate");
}

static slot* claim_empty_slot(uint64_t* rng, slot* self) {
  for (int tries = 0; tries < 8; ++tries) {
    slot* other = &g_slots[pick(rng, kSlots)];
    if (other == self || pthread_mutex_trylock(&other->claim) != 0) continue;
    if (other->session == NULL) return other;
    pthread_mutex_unlock(&other->claim);
  }
  return NULL;
}

static void op_fork(slot* sl, uint64_t* rng) {
  slot* dst = claim_empty_slot(rng, sl);
  kiln_session* fork = NULL;
  const foreign_marks before = marks(sl);
  kiln_status st;
  if (dst == NULL) return;
  st = kiln_session_fork(sl->session, &fork);
  if (!busy_excused(sl, st, &before)) {
    TCHECK(st == KILN_OK);
    if (st == KILN_OK) {
      dst->h = sl->h;
      note_origin(&dst->h, "f");
      dst->in_flight = 0;
      set_session(dst, fork, NULL); /* the fork owns its clone of the strategy */
      count(kOpFork);
    }
  }
  pthread_mutex_unlock(&dst->claim);
}

static void op_save(slot* sl, uint64_t* rng) {
  kiln_state_params params;
  size_t size = 0;
  void* data;
  const foreign_marks before = marks(sl);
  kiln_status st;
  kiln_state_params_init(&params, sizeof params);
  params.kv = pick(rng, 2);
  st = kiln_session_save_state(sl->session, &params, NULL, 0, &size);
  if (busy_excused(sl, st, &before)) return;
  TCHECK(st == KILN_ERR_BUFFER_TOO_SMALL && size > 0);
  if (st != KILN_ERR_BUFFER_TOO_SMALL) return;
  data = malloc(size);
  st = kiln_session_save_state(sl->session, &params, data, size, &size);
  if (busy_excused(sl, st, &before)) {
    free(data);
    return;
  }
  TCHECK(st == KILN_OK);
  if (st != KILN_OK) {
    free(data);
    return;
  }
  count(kOpSave);
  {
    saved_state* entry = &g_saved[pick(rng, kSavedStates)];
    pthread_mutex_lock(&g_saved_mu);
    free(entry->data);
    entry->data = data;
    entry->size = size;
    entry->h = sl->h;
    note_origin(&entry->h, params.kv ? "r1" : "r0");
    pthread_mutex_unlock(&g_saved_mu);
  }
}

/* Restores a saved state into a new session on the empty slot `sl`. */
static void op_restore(slot* sl, uint64_t* rng) {
  saved_state copy;
  kiln_session* s = NULL;
  kiln_strategy* strategy = NULL;
  kiln_status st;
  {
    saved_state* entry = &g_saved[pick(rng, kSavedStates)];
    pthread_mutex_lock(&g_saved_mu);
    copy = *entry;
    if (copy.data != NULL) {
      copy.data = malloc(entry->size);
      memcpy(copy.data, entry->data, entry->size);
    }
    pthread_mutex_unlock(&g_saved_mu);
  }
  if (copy.data == NULL) return;
  TCHECK(kiln_session_create(g_model, g_cache, g_samplers[copy.h.mode], &s) == KILN_OK);
  if (s != NULL && copy.h.ngram) {
    strategy = new_ngram(); /* the saved adaptive state is restored into it */
    TCHECK(kiln_session_set_strategy(s, strategy) == KILN_OK);
  }
  st = s == NULL ? KILN_ERR_INTERNAL : kiln_session_load_state(s, copy.data, copy.size);
  free(copy.data);
  if (st == KILN_ERR_CACHE_FULL) count(kOpCacheFull);
  TCHECK(st == KILN_OK || st == KILN_ERR_CACHE_FULL);
  if (st != KILN_OK) {
    kiln_session_destroy(s);
    kiln_strategy_destroy(strategy);
    return;
  }
  sl->h = copy.h;
  sl->in_flight = 0;
  set_session(sl, s, strategy);
  count(kOpRestore);
}

/* Calls that must be refused while a request is in flight on the session. */
static void op_assert_busy(slot* sl, uint64_t* rng) {
  kiln_generate_params gp;
  kiln_generate_result gr;
  kiln_request_params rp;
  kiln_session* fork = NULL;
  size_t size = 0, n = 0;
  int32_t tokens[4];
  kiln_generate_params_init(&gp, sizeof gp);
  gr.struct_size = sizeof gr;
  kiln_request_params_init(&rp, sizeof rp);
  switch (pick(rng, 6)) {
    case 0:
      TCHECK(kiln_session_generate(sl->session, &gp, &gr) == KILN_ERR_BUSY);
      break;
    case 1:
      TCHECK(kiln_session_submit(sl->session, &rp) == KILN_ERR_BUSY);
      break;
    case 2:
      TCHECK(kiln_session_fork(sl->session, &fork) == KILN_ERR_BUSY);
      TCHECK(fork == NULL);
      break;
    case 3:
      TCHECK(kiln_session_save_state(sl->session, NULL, NULL, 0, &size) == KILN_ERR_BUSY);
      break;
    case 4:
      TCHECK(kiln_session_get_tokens(sl->session, tokens, 4, &n) == KILN_ERR_BUSY);
      break;
    default:
      TCHECK(kiln_session_append_tokens(sl->session, g_prompt_tokens[1], 2) == KILN_ERR_BUSY);
      break;
  }
  count(kOpBusyChecked);
}

/* A thread that does not own slot `sl`: cancel, n_tokens, or a getter that must answer OK or
 * BUSY, never crash (the life lock keeps the session from being destroyed meanwhile). */
static void foreign_call(slot* sl, uint64_t* rng) {
  if (pthread_rwlock_tryrdlock(&sl->life) != 0) return;
  if (sl->session != NULL) {
    if (pick(rng, 8) == 0) {
      atomic_fetch_add(&sl->cancel_active, 1);
      atomic_fetch_add(&sl->cancels, 1);
      TCHECK(kiln_session_cancel(sl->session) == KILN_OK);
      atomic_fetch_sub(&sl->cancel_active, 1);
      count(kOpCancelForeign);
    } else {
      int32_t tokens[kMaxTokens];
      size_t n = 0;
      kiln_status st;
      atomic_fetch_add(&sl->peek_active, 1);
      atomic_fetch_add(&sl->peeks, 1);
      (void)kiln_session_n_tokens(sl->session);
      st = kiln_session_get_tokens(sl->session, tokens, kMaxTokens, &n);
      atomic_fetch_sub(&sl->peek_active, 1);
      TCHECK(st == KILN_OK || st == KILN_ERR_BUSY);
      count(st == KILN_OK ? kOpPeek : kOpPeekBusy);
    }
  }
  pthread_rwlock_unlock(&sl->life);
}

static void cache_op(uint64_t* rng) {
  switch (pick(rng, 6)) {
    case 0:
      TCHECK(kiln_cache_start_worker(g_cache) == KILN_OK);
      count(kOpWorkerStart);
      break;
    case 1:
      TCHECK(kiln_cache_stop_worker(g_cache) == KILN_OK);
      count(kOpWorkerStop);
      break;
    default: {
      kiln_step_params sp;
      kiln_step_result sr;
      kiln_step_params_init(&sp, sizeof sp);
      sp.time_budget_ms = pick(rng, 2) ? 2.0 : 0.0;
      sp.step_tokens = pick(rng, 2) ? 0 : 16 + pick(rng, 64);
      sr.struct_size = sizeof sr;
      TCHECK(kiln_cache_step(g_cache, &sp, &sr) == KILN_OK);
      TCHECK(sr.n_active >= 0);
      count(kOpStep);
    }
  }
}

/* One random operation on the claimed slot `sl`. */
static void slot_op(slot* sl, uint64_t* rng) {
  const int r = pick(rng, 100);
  if (sl->session == NULL) {
    if (r < 70) {
      op_create(sl, rng);
    } else {
      op_restore(sl, rng);
    }
    return;
  }
  if (sl->in_flight) {
    if (r < 70) {
      op_poll(sl, rng);
    } else if (r < 85) {
      op_assert_busy(sl, rng);
    } else if (r < 95) {
      TCHECK(kiln_session_cancel(sl->session) == KILN_OK);
      sl->own_cancel = 1;
      count(kOpCancelOwn);
    } else {
      destroy_slot(sl);
    }
    return;
  }
  if (kiln_session_n_tokens(sl->session) > kSessionLimit || sl->h.n_chunks == kMaxChunks || r < 8) {
    destroy_slot(sl);
  } else if (r < 40) {
    op_submit(sl, rng);
  } else if (r < 58) {
    op_generate(sl, rng);
  } else if (r < 70) {
    if (sl->h.prompted) op_fork(sl, rng);
  } else if (r < 82) {
    if (sl->h.prompted) op_save(sl, rng);
  } else {
    /* A cancel with nothing in flight has no effect: the next call is compared as usual. */
    TCHECK(kiln_session_cancel(sl->session) == KILN_OK);
    count(kOpCancelIdle);
    if (pick(rng, 2)) {
      op_submit(sl, rng);
    } else {
      op_generate(sl, rng);
    }
  }
}

typedef struct thread_arg {
  int index;
  double seconds;
} thread_arg;

static void* thread_main(void* p) {
  const thread_arg* arg = (const thread_arg*)p;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(arg->index + 1); /* fixed seed per thread */
  while (!atomic_load(&g_stop)) {
    const int r = pick(&rng, 100);
    if (r < 8) {
      cache_op(&rng);
    } else if (r < 16) {
      foreign_call(&g_slots[pick(&rng, kSlots)], &rng);
    } else {
      slot* sl = &g_slots[pick(&rng, kSlots)];
      if (pthread_mutex_trylock(&sl->claim) != 0) continue;
      slot_op(sl, &rng);
      pthread_mutex_unlock(&sl->claim);
    }
    if (arg->index == 0 && seconds_since_start() >= arg->seconds) atomic_store(&g_stop, 1);
  }
  return NULL;
}

/* After the threads: the worker finishes every request in flight, each is compared, then every
 * session is destroyed and the cache holds none. */
static void drain(void) {
  uint64_t rng = 1;
  CHECK(kiln_cache_start_worker(g_cache) == KILN_OK);
  for (int i = 0; i < kSlots; ++i) {
    slot* sl = &g_slots[i];
    const double deadline = seconds_since_start() + 120.0;
    while (sl->session != NULL && sl->in_flight && seconds_since_start() < deadline) {
      op_poll(sl, &rng);
    }
    CHECK(!sl->in_flight);
    if (sl->session != NULL) destroy_slot(sl);
  }
  CHECK(kiln_cache_stop_worker(g_cache) == KILN_OK);
  {
    kiln_cache_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    CHECK(kiln_cache_get_stats(g_cache, &stats) == KILN_OK);
    CHECK(stats.n_sequences == 0);
    CHECK(stats.blocks_used == 0);
  }
}

static kiln_cache* make_cache(size_t pool_bytes) {
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  kiln_cache_params_init(&cp, sizeof cp);
  cp.n_ctx = kNCtx;
  cp.n_threads = 2;
  cp.pool_bytes = pool_bytes;
  CHECK(kiln_cache_create(g_model, &cp, &cache) == KILN_OK);
  return cache;
}

int main(int argc, char** argv) {
  const char* env_seconds = getenv("KILN_STRESS_SECONDS");
  double seconds = argc > 2 ? atof(argv[2]) : env_seconds != NULL ? atof(env_seconds) : 5.0;
  kiln_model_params mp;
  kiln_model_info info;
  kiln_cache_stats stats;
  pthread_t threads[kThreads];
  thread_arg args[kThreads];
  if (argc < 2 || !(seconds > 0)) {
    fprintf(stderr, "usage: c_stress_test MODEL.gguf [SECONDS]\n");
    return 2;
  }
  kiln_model_params_init(&mp, sizeof mp);
  mp.path = argv[1];
  if (kiln_model_load(&mp, &g_model) != KILN_OK) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], kiln_last_error_message());
    return 1;
  }
  info.struct_size = sizeof info;
  CHECK(kiln_model_get_info(g_model, &info) == KILN_OK);
  /* Token prompts of random ids past the control tokens (the tiny vocabulary's first 3). */
  {
    uint64_t rng = 42;
    for (int p = 0; p < kPrompts; ++p) {
      g_prompt_len[p] = (size_t)(6 + pick(&rng, 40));
      for (size_t i = 0; i < g_prompt_len[p]; ++i) {
        g_prompt_tokens[p][i] = 3 + pick(&rng, info.n_vocab - 3);
      }
    }
  }
  for (int m = 1; m < kModes; ++m) {
    kiln_sampler_params sp;
    kiln_sampler_params_init(&sp, sizeof sp);
    sp.seed = (uint64_t)(7 * m);
    CHECK(kiln_sampler_create(&sp, &g_samplers[m]) == KILN_OK);
  }
  g_ref_cache = make_cache(0);
  /* The stress pool: 3 blocks per slot, less than the longest sessions need, so requests
   * are preempted (and recomputed) and some fail with KILN_ERR_CACHE_FULL. */
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  CHECK(kiln_cache_get_stats(g_ref_cache, &stats) == KILN_OK);
  g_cache = make_cache((size_t)kSlots * 3 * stats.block_bytes);
  if (g_cache == NULL || g_ref_cache == NULL) return 1;
  for (int i = 0; i < kSlots; ++i) {
    pthread_mutex_init(&g_slots[i].claim, NULL);
    pthread_rwlock_init(&g_slots[i].life, NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &g_start);
  for (int t = 0; t < kThreads; ++t) {
    args[t].index = t;
    args[t].seconds = seconds;
    CHECK(pthread_create(&threads[t], NULL, thread_main, &args[t]) == 0);
  }
  for (int t = 0; t < kThreads; ++t) pthread_join(threads[t], NULL);
  drain();

  printf("c_stress_test: %.1f s, %d threads, %d slots; operations:", seconds_since_start(),
         kThreads, kSlots);
  for (int k = 0; k < kOpCount; ++k) printf(" %s=%ld", kOpNames[k], atomic_load(&g_ops[k]));
  printf("\n");
  /* The run must have done each kind of work, else it checked nothing. */
  CHECK(atomic_load(&g_ops[kOpCompared]) > 0);
  CHECK(atomic_load(&g_ops[kOpFork]) > 0);
  CHECK(atomic_load(&g_ops[kOpRestore]) > 0);
  CHECK(atomic_load(&g_ops[kOpPollDone]) > 0);

  for (int i = 0; i < kSavedStates; ++i) free(g_saved[i].data);
  for (int i = 0; i < kSlots; ++i) {
    pthread_mutex_destroy(&g_slots[i].claim);
    pthread_rwlock_destroy(&g_slots[i].life);
  }
  kiln_cache_destroy(g_cache);
  kiln_cache_destroy(g_ref_cache);
  for (int m = 1; m < kModes; ++m) kiln_sampler_destroy(g_samplers[m]);
  kiln_model_destroy(g_model);
  g_failures += atomic_load(&g_thread_failures);
  if (g_failures > 0) {
    fprintf(stderr, "c_stress_test: %d failures\n", g_failures);
    return 1;
  }
  printf("c_stress_test: ok\n");
  return 0;
}
