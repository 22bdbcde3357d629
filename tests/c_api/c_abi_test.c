/* A caller built against the frozen ABI 1 baseline header (abi/kiln_abi1.h), not the current
 * <kiln/kiln.h>, runs against the current library (strict C11 + POSIX):
 * - the current header keeps every baseline struct's field offsets and sizes and every
 *   constant, and versioned structs only grow (c_abi_layout_*.c);
 * - the library exports every baseline function (this program links them all);
 * - every versioned struct passed with the baseline's size, where the library's own struct may
 *   be larger, is accepted, and the library reads and writes none of the bytes after it: they
 *   lie on an inaccessible page (a touch faults) or hold guard bytes that are checked;
 * - sizes from the first release's smallest up are accepted; smaller ones, 0 included, are
 *   rejected with a message naming the struct;
 * - a whole session on the real default model works through the baseline structs.
 * On Windows the guard page comes from VirtualAlloc instead of mmap. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(_WIN32)
#include <windows.h> /* VirtualAlloc, VirtualProtect: the guard page */
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "abi/kiln_abi1.h"
#include "abi/kiln_abi1_layout.h"
#include "c_abi_layout.h"

static int g_failures = 0;
#include "c_check.h"

_Static_assert(KILN_ABI_VERSION == 1, "this test is built against the ABI 1 baseline");

/* Where `field` ends: the smallest struct_size that holds it (no trailing padding). */
#define FIELD_END(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

enum { kGuardBytes = 32 };
#define GUARD_BYTE 0xA5

/* Non-zero when bytes [from, to) of p all equal `value`. */
static int bytes_are(const void* p, size_t from, size_t to, unsigned char value) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i;
  for (i = from; i < to; ++i) {
    if (b[i] != value) return 0;
  }
  return 1;
}

static int message_names(const char* a, const char* b) {
  const char* m = kiln_last_error_message();
  return strstr(m, a) != NULL && (b == NULL || strstr(m, b) != NULL);
}

/* `size` bytes (guard bytes) that end where an inaccessible page begins, so the library touching
 * a byte after them faults. `size` must be a multiple of the alignment of what is stored there
 * (the sizeof of a struct is). Freed by page_end_free_all. */
enum { kMaxPageEnds = 16 };
static unsigned char* g_page_ends[kMaxPageEnds];
static int g_n_page_ends = 0;

static size_t page_size(void) {
#if defined(_WIN32)
  SYSTEM_INFO info;
  GetSystemInfo(&info);
  return (size_t)info.dwPageSize;
#else
  return (size_t)sysconf(_SC_PAGESIZE);
#endif
}

static void* page_end(size_t size) {
  const size_t page = page_size();
  void* base;
  if (g_n_page_ends == kMaxPageEnds) abort();
#if defined(_WIN32)
  DWORD old_protection;
  base = VirtualAlloc(NULL, 2 * page, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
  if (base == NULL ||
      !VirtualProtect((unsigned char*)base + page, page, PAGE_NOACCESS, &old_protection))
    abort();
#else
  base = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED || mprotect((unsigned char*)base + page, page, PROT_NONE) != 0) abort();
#endif
  g_page_ends[g_n_page_ends++] = (unsigned char*)base;
  memset(base, GUARD_BYTE, page);
  return (unsigned char*)base + page - size;
}

static void page_end_free_all(void) {
#if defined(_WIN32)
  while (g_n_page_ends > 0) VirtualFree(g_page_ends[--g_n_page_ends], 0, MEM_RELEASE);
#else
  const size_t page = page_size();
  while (g_n_page_ends > 0) munmap(g_page_ends[--g_n_page_ends], 2 * page);
#endif
}

/* ---------------------------------------------------------------- layout and exports */

static void test_layout(void) {
  const abi_record* baseline = NULL;
  const abi_record* current = NULL;
  const size_t n = abi_layout_baseline(&baseline);
  size_t i;
  CHECK(abi_layout_current(&current) == n);
  CHECK(n > 150);
  for (i = 0; i < n; ++i) {
    const int same_entry = strcmp(baseline[i].what, current[i].what) == 0;
    const int ok = baseline[i].kind == ABI_EXACT ? current[i].value == baseline[i].value
                                                 : current[i].value >= baseline[i].value;
    CHECK(same_entry);
    if (!ok) {
      fprintf(stderr, "%s: baseline %lld, current %lld\n", baseline[i].what, baseline[i].value,
              current[i].value);
    }
    CHECK(ok);
  }
}

typedef void (*any_function)(void);
#define ABI_FUNCTION(name) (any_function) name,
static const any_function kFunctions[] = {KILN_ABI1_FUNCTIONS(ABI_FUNCTION)};

static void test_exports(void) {
  size_t i;
  CHECK(sizeof kFunctions / sizeof kFunctions[0] == 43);
  for (i = 0; i < sizeof kFunctions / sizeof kFunctions[0]; ++i) CHECK(kFunctions[i] != NULL);
  CHECK(kiln_abi_version() == KILN_ABI_VERSION);
  CHECK(strncmp(kiln_version(), "0.", 2) == 0 && strcmp(kiln_version(), "0.2.0") >= 0);
}

/* ---------------------------------------------------------------- init functions
 *
 * For each parameter struct: the init function with sizeof (the baseline's), the first
 * release's smallest size, one byte less, 0, NULL and a newer caller's larger struct. The struct
 * sits in a larger object whose bytes after struct_size are guard bytes. */
#define CHECK_INIT(type, init, last_field)                                                         \
  do {                                                                                             \
    struct {                                                                                       \
      type s;                                                                                      \
      unsigned char after[kGuardBytes];                                                            \
    } g, reference;                                                                                \
    const size_t min_size = FIELD_END(type, last_field);                                           \
    memset(&reference, GUARD_BYTE, sizeof reference);                                              \
    CHECK(init(&reference.s, sizeof reference.s) == KILN_OK);                                      \
    CHECK(reference.s.struct_size == sizeof reference.s);                                          \
    CHECK(bytes_are(&reference, sizeof reference.s, sizeof reference, GUARD_BYTE));                \
    memset(&g, GUARD_BYTE, sizeof g);                                                              \
    CHECK(init(&g.s, min_size) == KILN_OK);                                                        \
    CHECK(g.s.struct_size == min_size);                                                            \
    CHECK(bytes_are(&g, min_size, sizeof g, GUARD_BYTE));                                          \
    CHECK(memcmp((const char*)&g.s + sizeof(uint32_t),                                             \
                 (const char*)&reference.s + sizeof(uint32_t), min_size - sizeof(uint32_t)) == 0); \
    memset(&g, GUARD_BYTE, sizeof g);                                                              \
    CHECK(init(&g.s, min_size - 1) == KILN_ERR_INVALID_ARGUMENT);                                  \
    CHECK(message_names(#type, "struct_size"));                                                    \
    CHECK(bytes_are(&g, 0, sizeof g, GUARD_BYTE));                                                 \
    CHECK(init(&g.s, 0) == KILN_ERR_INVALID_ARGUMENT);                                             \
    CHECK(message_names(#type, "struct_size 0 "));                                                 \
    CHECK(bytes_are(&g, 0, sizeof g, GUARD_BYTE));                                                 \
    CHECK(init(NULL, sizeof g.s) == KILN_ERR_INVALID_ARGUMENT);                                    \
    /* A caller built against a newer header: its struct holds 8 more bytes. */                    \
    memset(&g, GUARD_BYTE, sizeof g);                                                              \
    CHECK(init(&g.s, sizeof g.s + 8) == KILN_OK);                                                  \
    CHECK(g.s.struct_size == sizeof g.s + 8);                                                      \
    CHECK(bytes_are(&g, sizeof g.s + 8, sizeof g, GUARD_BYTE));                                    \
    CHECK(memcmp((const char*)&g.s + sizeof(uint32_t),                                             \
                 (const char*)&reference.s + sizeof(uint32_t),                                     \
                 sizeof g.s - sizeof(uint32_t)) == 0);                                             \
  } while (0)

static void test_init_functions(void) {
  CHECK_INIT(kiln_model_params, kiln_model_params_init, log_user_data);
  CHECK_INIT(kiln_cache_params, kiln_cache_params_init, llama_cpp_order);
  CHECK_INIT(kiln_sampler_params, kiln_sampler_params_init, n_logit_bias);
  CHECK_INIT(kiln_generate_params, kiln_generate_params_init, user_data);
  CHECK_INIT(kiln_ngram_params, kiln_ngram_params_init, fixed_pass_cost_beta);
  CHECK_INIT(kiln_draft_params, kiln_draft_params_init, fixed_pass_cost_beta);
}

/* The defaults kiln.h documents, as the baseline caller sees them. */
static void test_defaults(void) {
  kiln_model_params mp;
  kiln_cache_params cp;
  kiln_sampler_params sp;
  kiln_generate_params gp;
  kiln_ngram_params np;
  kiln_draft_params dp;
  CHECK(kiln_model_params_init(&mp, sizeof mp) == KILN_OK);
  CHECK(mp.path == NULL && mp.use_mmap == 1 && mp.progress == NULL && mp.log == NULL);
  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  CHECK(cp.pool_bytes == 0 && cp.block_size == 16 && cp.kv_type == KILN_KV_F16);
  CHECK(cp.prefix_caching == 1 && cp.n_ctx == 0 && cp.n_threads == 0 && cp.llama_cpp_order == 0);
  CHECK(kiln_sampler_params_init(&sp, sizeof sp) == KILN_OK);
  CHECK(sp.temperature > 0.79f && sp.temperature < 0.81f && sp.top_k == 40);
  CHECK(sp.penalty_last_n == 64 && sp.seed == 0 && sp.logit_bias == NULL && sp.n_logit_bias == 0);
  CHECK(kiln_generate_params_init(&gp, sizeof gp) == KILN_OK);
  CHECK(gp.max_tokens == 128 && gp.stop_strings == NULL && gp.callback == NULL);
  CHECK(kiln_ngram_params_init(&np, sizeof np) == KILN_OK);
  CHECK(np.max_ngram == 3 && np.min_ngram == 1 && np.max_draft == 8 && np.start_draft == 4);
  CHECK(np.max_skip == 32 && np.adaptive == 1 && np.fixed_pass_cost_beta < 0);
  CHECK(kiln_draft_params_init(&dp, sizeof dp) == KILN_OK);
  CHECK(dp.max_draft == 5 && dp.adaptive == 1 && dp.n_ctx == 0 && dp.fixed_pass_cost_beta < 0);
}

/* ---------------------------------------------------------------- a session, guarded */

/* An output struct filled with struct_size = the first release's smallest (guard bytes after
 * it), one byte less and 0 (rejected, nothing written). `call` uses the variable `out`. */
#define CHECK_OUTPUT_SIZES(type, last_field, call)                \
  do {                                                            \
    struct {                                                      \
      type s;                                                     \
      unsigned char after[kGuardBytes];                           \
    } g;                                                          \
    type* out = &g.s;                                             \
    const size_t min_size = FIELD_END(type, last_field);          \
    memset(&g, GUARD_BYTE, sizeof g);                             \
    g.s.struct_size = (uint32_t)min_size;                         \
    CHECK((call) == KILN_OK);                                     \
    CHECK(g.s.struct_size == min_size);                           \
    CHECK(bytes_are(&g, min_size, sizeof g, GUARD_BYTE));         \
    memset(&g, GUARD_BYTE, sizeof g);                             \
    g.s.struct_size = (uint32_t)(min_size - 1);                   \
    CHECK((call) == KILN_ERR_INVALID_ARGUMENT);                   \
    CHECK(message_names(#type, "struct_size"));                   \
    CHECK(bytes_are(&g, sizeof(uint32_t), sizeof g, GUARD_BYTE)); \
    g.s.struct_size = 0;                                          \
    CHECK((call) == KILN_ERR_INVALID_ARGUMENT);                   \
    CHECK(bytes_are(&g, sizeof(uint32_t), sizeof g, GUARD_BYTE)); \
  } while (0)

static void test_session(const char* model_path) {
  kiln_model_params* mp;
  kiln_model* model = NULL;
  kiln_model_info* info;
  kiln_cache_params* cp;
  kiln_cache* cache = NULL;
  kiln_cache_stats* stats;
  kiln_sampler_params* sp;
  kiln_sampler* sampler = NULL;
  kiln_session* session = NULL;
  kiln_generate_params* gp;
  kiln_generate_result* gr;
  kiln_ngram_params* np;
  kiln_draft_params* dp;
  kiln_strategy* strategy = NULL;
  kiln_spec_metrics* metrics;
  const char* prompt =
      "<|im_start|>user\nCount: one two three four five<|im_end|>\n<|im_start|>assistant\n";
  int32_t generated;
  size_t n_before;

  /* Parameter structs end right before the inaccessible page: a read past them faults. */
  mp = (kiln_model_params*)page_end(sizeof *mp);
  CHECK(kiln_model_params_init(mp, sizeof *mp) == KILN_OK);
  mp->path = model_path;
  CHECK(kiln_model_load(mp, &model) == KILN_OK);
  if (model == NULL) {
    page_end_free_all();
    return;
  }
  mp->struct_size = (uint32_t)(FIELD_END(kiln_model_params, log_user_data) - 1);
  CHECK(kiln_model_load(mp, &model) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(message_names("kiln_model_params", "below"));

  info = (kiln_model_info*)page_end(sizeof *info);
  info->struct_size = sizeof *info;
  CHECK(kiln_model_get_info(model, info) == KILN_OK);
  CHECK(info->struct_size == sizeof *info);
  CHECK(info->n_layer == 30 && info->n_vocab == 49152 && info->token_eot >= -1);
  CHECK_OUTPUT_SIZES(kiln_model_info, token_eot, kiln_model_get_info(model, out));

  cp = (kiln_cache_params*)page_end(sizeof *cp);
  CHECK(kiln_cache_params_init(cp, sizeof *cp) == KILN_OK);
  cp->n_threads = 2;
  cp->n_ctx = 512;
  cp->struct_size = 0;
  CHECK(kiln_cache_create(model, cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(message_names("kiln_cache_params", "struct_size 0 "));
  cp->struct_size = sizeof *cp;
  CHECK(kiln_cache_create(model, cp, &cache) == KILN_OK);
  if (cache == NULL) {
    kiln_model_destroy(model);
    page_end_free_all();
    return;
  }

  stats = (kiln_cache_stats*)page_end(sizeof *stats);
  stats->struct_size = sizeof *stats;
  CHECK(kiln_cache_get_stats(cache, stats) == KILN_OK);
  CHECK(stats->n_ctx == 512 && stats->block_size == 16 && stats->block_bytes > 0);
  CHECK_OUTPUT_SIZES(kiln_cache_stats, block_bytes, kiln_cache_get_stats(cache, out));

  sp = (kiln_sampler_params*)page_end(sizeof *sp);
  CHECK(kiln_sampler_params_init(sp, sizeof *sp) == KILN_OK);
  sp->temperature = 0.0f;
  sp->struct_size = 4;
  CHECK(kiln_sampler_create(sp, &sampler) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(message_names("kiln_sampler_params", "below"));
  sp->struct_size = sizeof *sp;
  CHECK(kiln_sampler_create(sp, &sampler) == KILN_OK);
  CHECK(kiln_session_create(model, cache, sampler, &session) == KILN_OK);
  kiln_sampler_destroy(sampler);
  if (session == NULL) {
    kiln_cache_destroy(cache);
    kiln_model_destroy(model);
    page_end_free_all();
    return;
  }
  CHECK(kiln_session_append_text(session, prompt, strlen(prompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
        KILN_OK);

  /* Generate: its params at the page end, then its result; a bad size of either changes
   * nothing. */
  gp = (kiln_generate_params*)page_end(sizeof *gp);
  CHECK(kiln_generate_params_init(gp, sizeof *gp) == KILN_OK);
  gp->max_tokens = 6;
  {
    kiln_generate_result result;
    result.struct_size = sizeof result;
    n_before = kiln_session_n_tokens(session);
    gp->struct_size = (uint32_t)(FIELD_END(kiln_generate_params, user_data) - 1);
    CHECK(kiln_session_generate(session, gp, &result) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(message_names("kiln_generate_params", "below"));
    gp->struct_size = sizeof *gp;
    result.struct_size = (uint32_t)(FIELD_END(kiln_generate_result, stop_reason) - 1);
    CHECK(kiln_session_generate(session, gp, &result) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(message_names("kiln_generate_result", "below"));
    CHECK(kiln_session_n_tokens(session) == n_before);
    result.struct_size = 0;
    CHECK(kiln_session_generate(session, gp, &result) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_session_n_tokens(session) == n_before);
  }
  gr = (kiln_generate_result*)page_end(sizeof *gr);
  gr->struct_size = sizeof *gr;
  CHECK(kiln_session_generate(session, gp, gr) == KILN_OK);
  CHECK(gr->struct_size == sizeof *gr);
  CHECK(gr->n_tokens > 0 && gr->n_tokens <= 6);
  CHECK(gr->stop_reason == KILN_STOP_MAX_TOKENS || gr->stop_reason == KILN_STOP_EOG);
  CHECK(kiln_session_n_tokens(session) == n_before + (size_t)gr->n_tokens);

  /* Speculative: n-gram strategy from guarded params, metrics into a guarded struct. */
  np = (kiln_ngram_params*)page_end(sizeof *np);
  CHECK(kiln_ngram_params_init(np, sizeof *np) == KILN_OK);
  np->struct_size = (uint32_t)(FIELD_END(kiln_ngram_params, fixed_pass_cost_beta) - 1);
  CHECK(kiln_strategy_create_ngram(np, &strategy) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(message_names("kiln_ngram_params", "below"));
  np->struct_size = sizeof *np;
  CHECK(kiln_strategy_create_ngram(np, &strategy) == KILN_OK);
  CHECK(kiln_session_set_strategy(session, strategy) == KILN_OK);
  CHECK(kiln_session_append_text(session, prompt, strlen(prompt), KILN_TOKENIZE_PARSE_SPECIAL) ==
        KILN_OK);
  gp = (kiln_generate_params*)page_end(sizeof *gp);
  CHECK(kiln_generate_params_init(gp, sizeof *gp) == KILN_OK);
  gp->max_tokens = 12;
  {
    kiln_generate_result result;
    result.struct_size = sizeof result;
    CHECK(kiln_session_generate(session, gp, &result) == KILN_OK);
    generated = result.n_tokens;
  }
  metrics = (kiln_spec_metrics*)page_end(sizeof *metrics);
  metrics->struct_size = sizeof *metrics;
  CHECK(kiln_session_get_spec_metrics(session, metrics) == KILN_OK);
  CHECK(metrics->struct_size == sizeof *metrics);
  CHECK(generated > 1); /* the first token is sampled plainly, the next by speculative steps */
  CHECK(metrics->steps > 0 && metrics->generated > 0);
  CHECK(metrics->accepted <= metrics->drafted);
  CHECK_OUTPUT_SIZES(kiln_spec_metrics, target_passes_per_token,
                     kiln_session_get_spec_metrics(session, out));
  CHECK(kiln_session_set_strategy(session, NULL) == KILN_OK);
  kiln_strategy_destroy(strategy);
  strategy = NULL;

  /* Draft strategy parameters are read before the draft file is opened. */
  dp = (kiln_draft_params*)page_end(sizeof *dp);
  CHECK(kiln_draft_params_init(dp, sizeof *dp) == KILN_OK);
  dp->struct_size = (uint32_t)(FIELD_END(kiln_draft_params, fixed_pass_cost_beta) - 1);
  CHECK(kiln_strategy_create_draft(model, "/nonexistent/draft.gguf", dp, &strategy) ==
        KILN_ERR_INVALID_ARGUMENT);
  CHECK(message_names("kiln_draft_params", "below"));
  dp->struct_size = sizeof *dp;
  CHECK(kiln_strategy_create_draft(model, "/nonexistent/draft.gguf", dp, &strategy) == KILN_ERR_IO);
  CHECK(strategy == NULL);

  kiln_session_destroy(session);
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  page_end_free_all();
}

int main(void) {
  char path[1024];
  const char* dir = getenv("KILN_MODEL_DIR");
  const char* home = getenv("HOME");
  if (dir && *dir) {
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
  } else {
    snprintf(path, sizeof path, "%s/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
  }
  test_layout();
  test_exports();
  test_init_functions();
  test_defaults();
  test_session(path);
  if (g_failures) {
    fprintf(stderr, "c_abi_test: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("c_abi_test: all checks passed\n");
  return 0;
}
