/* Exercises the public API from plain C (compiled with -std=c11 -Werror -Wstrict-prototypes),
 * on the real default model and on bad input. */
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_failures = 0;
#include "c_check.h"

static void test_versions(void) {
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", KILN_VERSION_MAJOR, KILN_VERSION_MINOR,
           KILN_VERSION_PATCH);
  CHECK(strcmp(kiln_version(), expected) == 0);
  CHECK(kiln_abi_version() == KILN_ABI_VERSION);
  CHECK(strcmp(kiln_status_name(KILN_ERR_FORMAT), "KILN_ERR_FORMAT") == 0);
  CHECK(strcmp(kiln_status_name((kiln_status)999), "KILN_ERR_UNKNOWN") == 0);
}

/* "LEVEL (FEATURES)", LEVEL the kernels in use; with KILN_CPU_LEVEL=scalar, the scalar ones. */
static void test_cpu_info(void) {
  const char* info = kiln_cpu_info();
  const char* forced = getenv("KILN_CPU_LEVEL");
  CHECK(info != NULL && strchr(info, '(') != NULL && info[strlen(info) - 1] == ')');
  CHECK(strncmp(info, "avx512 (", 8) == 0 || strncmp(info, "avx2 (", 6) == 0 ||
        strncmp(info, "scalar (", 8) == 0);
  if (forced != NULL && strcmp(forced, "scalar") == 0) CHECK(strcmp(info, "scalar (none)") == 0);
  CHECK(kiln_cpu_info() == info); /* one static string */
}

static int g_progress_calls = 0;
static int count_progress(float progress, void* user_data) {
  (void)user_data;
  CHECK(progress >= 0.0f && progress <= 1.0f);
  ++g_progress_calls;
  return 0;
}
static int cancel_progress(float progress, void* user_data) {
  (void)progress;
  (void)user_data;
  return 1;
}
static int g_log_lines = 0;
static void count_log(kiln_log_level level, const char* message, void* user_data) {
  (void)level;
  CHECK(message != NULL && user_data == &g_log_lines);
  ++g_log_lines;
}

static void test_bad_loads(const char* tmp_dir) {
  kiln_model* model = NULL;
  kiln_model_params params;
  kiln_model_params_init(&params, sizeof params);
  CHECK(kiln_model_load(NULL, &model) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_model_load(&params, NULL) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_model_load(&params, &model) == KILN_ERR_INVALID_ARGUMENT); /* no path */
  params.path = "/nonexistent/model.gguf";
  CHECK(kiln_model_load(&params, &model) == KILN_ERR_IO);
  CHECK(strstr(kiln_last_error_message(), "/nonexistent/model.gguf") != NULL);
  params.struct_size = 4;
  CHECK(kiln_model_load(&params, &model) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "struct_size 4 is below") != NULL);

  /* A file that is not GGUF. */
  char bad_path[512];
  snprintf(bad_path, sizeof bad_path, "%s/kiln_c_api_bad.gguf", tmp_dir);
  FILE* f = fopen(bad_path, "wb");
  CHECK(f != NULL);
  if (f) {
    fputs("GGUX this is not a model file at all, just text", f);
    fclose(f);
  }
  kiln_model_params_init(&params, sizeof params);
  params.path = bad_path;
  CHECK(kiln_model_load(&params, &model) == KILN_ERR_FORMAT);
  CHECK(strlen(kiln_last_error_message()) > 0);
  remove(bad_path);
  CHECK(model == NULL);
  kiln_model_destroy(NULL); /* no-op */
}

/* A caller built against a newer header passes structs larger than this library knows: they are
 * accepted, the fields the library does not know read zero, and nothing past struct_size is
 * written. (tests/c_api/c_abi_test.c holds the library to the frozen ABI 1 baseline.) */
typedef struct newer_model_info {
  kiln_model_info info;
  int64_t added_later;
  unsigned char after[16];
} newer_model_info;
typedef struct newer_cache_params {
  kiln_cache_params params;
  int64_t added_later;
  unsigned char after[16];
} newer_cache_params;

static int all_bytes(const unsigned char* p, size_t n, unsigned char value) {
  size_t i;
  for (i = 0; i < n; ++i) {
    if (p[i] != value) return 0;
  }
  return 1;
}

static void test_newer_caller(const kiln_model* model) {
  newer_model_info info;
  newer_cache_params cp;
  kiln_cache* cache = NULL;
  memset(&info, 0xA5, sizeof info);
  info.info.struct_size = (uint32_t)offsetof(newer_model_info, after);
  CHECK(kiln_model_get_info(model, &info.info) == KILN_OK);
  CHECK(info.info.struct_size == offsetof(newer_model_info, after));
  CHECK(info.info.n_layer == 30);
  CHECK(info.added_later == 0);
  CHECK(all_bytes(info.after, sizeof info.after, 0xA5));

  memset(&cp, 0xA5, sizeof cp);
  CHECK(kiln_cache_params_init(&cp.params, offsetof(newer_cache_params, after)) == KILN_OK);
  CHECK(cp.params.struct_size == offsetof(newer_cache_params, after));
  CHECK(cp.params.block_size == 16 && cp.added_later == 0);
  CHECK(all_bytes(cp.after, sizeof cp.after, 0xA5));
  cp.params.n_ctx = 256;
  cp.params.n_threads = 1;
  cp.added_later = 12345; /* unknown to this library: ignored */
  CHECK(kiln_cache_create(model, &cp.params, &cache) == KILN_OK);
  kiln_cache_destroy(cache);

  /* struct_size is a uint32_t: a larger size cannot be a struct's. */
  if ((uint64_t)SIZE_MAX > UINT32_MAX) {
    CHECK(kiln_cache_params_init(&cp.params, (size_t)((uint64_t)UINT32_MAX + 1)) ==
          KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_last_error_message(), "uint32_t") != NULL);
  }
}

/* The backend choice: a CUDA request gives a working cache either way; where it cannot run on the
 * device (here: no device or module; on a GPU machine: the CUDA backend still lacks attention
 * kernels) it runs on the CPU and kiln_cache_backend says why. A caller whose struct ends before
 * the field gets the CPU without a note. */
static void test_backend_choice(const kiln_model* model) {
  kiln_cache_params cp;
  kiln_cache* cache = NULL;
  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  CHECK(cp.backend == KILN_BACKEND_CPU && cp.cuda_device == 0);
  cp.n_ctx = 64;
  cp.n_threads = 1;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  CHECK(strncmp(kiln_cache_backend(cache), "cpu (", 5) == 0);
  CHECK(strstr(kiln_cache_backend(cache), "cuda") == NULL);
  kiln_cache_destroy(cache);

  cp.backend = KILN_BACKEND_CUDA;
  cache = NULL;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  CHECK(strncmp(kiln_cache_backend(cache), "cpu (", 5) == 0);
  CHECK(strstr(kiln_cache_backend(cache), "; cuda requested, running on the CPU: ") != NULL);
  kiln_cache_destroy(cache);

  cp.backend = KILN_BACKEND_AUTO;
  cp.cuda_device = 99;
  cache = NULL;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  CHECK(strstr(kiln_cache_backend(cache), "cuda requested, running on the CPU") != NULL);
  kiln_cache_destroy(cache);

  /* An older caller's struct, ending before the field: the bytes past it are never read. */
  memset((char*)&cp + offsetof(kiln_cache_params, backend), 0x7F,
         sizeof cp - offsetof(kiln_cache_params, backend));
  cp.struct_size = (uint32_t)offsetof(kiln_cache_params, backend);
  cache = NULL;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_OK);
  CHECK(strstr(kiln_cache_backend(cache), "cuda") == NULL);
  kiln_cache_destroy(cache);

  CHECK(kiln_cache_params_init(&cp, sizeof cp) == KILN_OK);
  cp.backend = (kiln_backend_kind)7;
  cache = NULL;
  CHECK(kiln_cache_create(model, &cp, &cache) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  CHECK(strstr(kiln_last_error_message(), "params->backend 7") != NULL);
  CHECK(strcmp(kiln_cache_backend(NULL), "") == 0);
}

static void test_model(const char* path) {
  kiln_model_params params;
  kiln_model_params_init(&params, sizeof params);
  params.path = path;
  params.progress = cancel_progress;
  kiln_model* model = NULL;
  CHECK(kiln_model_load(&params, &model) == KILN_ERR_CANCELLED);
  CHECK(model == NULL);

  params.progress = count_progress;
  params.log = count_log;
  params.log_user_data = &g_log_lines;
  CHECK(kiln_model_load(&params, &model) == KILN_OK);
  if (model == NULL) return;
  CHECK(g_progress_calls >= 2);
  CHECK(g_log_lines >= 1);

  kiln_model_info info;
  info.struct_size = sizeof info;
  CHECK(kiln_model_get_info(model, &info) == KILN_OK);
  CHECK(strcmp(info.architecture, "llama") == 0);
  CHECK(info.n_layer == 30 && info.n_embd == 576 && info.n_head == 9 && info.n_head_kv == 3);
  CHECK(info.n_vocab == 49152 && info.head_dim == 64 && info.n_ff == 1536);
  CHECK(info.token_bos == 1 && info.token_eos == 2);
  CHECK(info.n_params > 134000000 && info.n_params < 135000000);
  info.struct_size = 8;
  CHECK(kiln_model_get_info(model, &info) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "kiln_model_info") != NULL);
  test_newer_caller(model);
  test_backend_choice(model);

  const char* value = NULL;
  CHECK(kiln_model_meta_get(model, "llama.block_count", &value) == KILN_OK);
  CHECK(value && strcmp(value, "30") == 0);
  CHECK(kiln_model_meta_get(model, "no.such.key", &value) == KILN_ERR_OUT_OF_RANGE);
  CHECK(kiln_model_meta_count(model) == 33);
  const char* key = NULL;
  CHECK(kiln_model_meta_at(model, 0, &key, &value) == KILN_OK);
  CHECK(key && strcmp(key, "general.architecture") == 0);
  CHECK(kiln_model_meta_at(model, 1000, &key, &value) == KILN_ERR_OUT_OF_RANGE);
  CHECK(kiln_model_token_is_eog(model, 2) == 1);
  CHECK(kiln_model_token_is_eog(model, 100) == 0);
  CHECK(kiln_model_token_is_eog(model, -5) == 0);

  /* Tokenize: size query, then fill; round trip through detokenize. */
  const char* text = "Hello world! Caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 <|im_start|>";
  size_t n = 0;
  CHECK(kiln_tokenize(model, text, strlen(text), 0, NULL, 0, &n) == KILN_ERR_BUFFER_TOO_SMALL);
  CHECK(n > 5);
  int32_t tokens[64];
  size_t n2 = 0;
  CHECK(kiln_tokenize(model, text, strlen(text), 0, tokens, 64, &n2) == KILN_OK);
  CHECK(n2 == n);
  CHECK(tokens[0] == 19556 && tokens[1] == 905); /* "Hello", " world" */
  size_t n_special = 0;
  int32_t special_tokens[64];
  CHECK(kiln_tokenize(model, text, strlen(text), KILN_TOKENIZE_PARSE_SPECIAL, special_tokens, 64,
                      &n_special) == KILN_OK);
  CHECK(n_special < n && special_tokens[n_special - 1] == 1); /* <|im_start|> is id 1 */
  char out[256];
  size_t out_len = 0;
  CHECK(kiln_detokenize(model, tokens, n2, 0, out, sizeof out, &out_len) == KILN_OK);
  CHECK(out_len == strlen(text) && memcmp(out, text, out_len) == 0);
  CHECK(kiln_detokenize(model, tokens, n2, 0, out, 3, &out_len) == KILN_ERR_BUFFER_TOO_SMALL);
  CHECK(out_len == strlen(text));
  int32_t bad_ids[2] = {5, 49152};
  CHECK(kiln_detokenize(model, bad_ids, 2, 0, out, sizeof out, &out_len) ==
        KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "49152") != NULL);
  CHECK(kiln_tokenize(model, NULL, 0, 0, NULL, 0, &n) == KILN_OK && n == 0);
  CHECK(kiln_tokenize(model, NULL, 3, 0, tokens, 64, &n) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_tokenize(NULL, "x", 1, 0, tokens, 64, &n) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_tokenize(model, "x", 1, 0x80, tokens, 64, &n) == KILN_ERR_INVALID_ARGUMENT);

  /* Chat template: the model's own (ChatML with SmolLM's default system prompt). */
  kiln_chat_message msgs[1] = {{"user", "Hi!"}};
  size_t len = 0;
  CHECK(kiln_chat_apply_template(model, NULL, msgs, 1, 1, NULL, 0, &len) ==
        KILN_ERR_BUFFER_TOO_SMALL);
  char* rendered = (char*)malloc(len + 1);
  CHECK(kiln_chat_apply_template(model, NULL, msgs, 1, 1, rendered, len, &len) == KILN_OK);
  rendered[len] = '\0';
  CHECK(strstr(rendered, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM") ==
        rendered);
  CHECK(strstr(rendered, "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n") != NULL);
  free(rendered);
  kiln_chat_message bad_role[1] = {{"wizard", "Hi"}};
  CHECK(kiln_chat_apply_template(model, NULL, bad_role, 1, 1, out, sizeof out, &len) ==
        KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_chat_apply_template(model, "{{ not a known template }}", msgs, 1, 1, out, sizeof out,
                                 &len) != KILN_OK);
  CHECK(kiln_chat_apply_template(model, "llama3", msgs, 1, 1, out, sizeof out, &len) == KILN_OK);

  /* Medusa heads: defaults, a missing file, and a file that is not a head (the model itself). */
  kiln_medusa_params mp;
  CHECK(kiln_medusa_params_init(&mp, sizeof mp) == KILN_OK);
  CHECK(mp.struct_size == sizeof mp && mp.max_draft == 0 && mp.n_threads == 1 &&
        mp.merge_ngram == 1);
  /* Typical acceptance (lossy) is off unless asked for, with Medusa's thresholds ready; a caller
   * from before it gets its struct's fields only. */
  CHECK(mp.typical_acceptance == 0 && mp.typical_epsilon == 0.09f && mp.typical_delta == 0.3f);
  mp.typical_acceptance = 5;
  CHECK(kiln_medusa_params_init(&mp, offsetof(kiln_medusa_params, typical_acceptance)) == KILN_OK);
  CHECK(mp.typical_acceptance == 5 && mp.merge_ngram == 1);
  CHECK(kiln_medusa_params_init(&mp, sizeof mp) == KILN_OK);
  mp.merge_ngram = 7; /* a caller from before merge_ngram: the field is not written */
  CHECK(kiln_medusa_params_init(&mp, offsetof(kiln_medusa_params, merge_ngram)) == KILN_OK);
  CHECK(mp.merge_ngram == 7 && mp.n_threads == 1);
  kiln_strategy* medusa = NULL;
  CHECK(kiln_strategy_create_medusa(model, "/nonexistent/head.gguf", &mp, &medusa) == KILN_ERR_IO);
  CHECK(kiln_strategy_create_medusa(model, path, &mp, &medusa) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "not a medusa head") != NULL);
  CHECK(kiln_strategy_create_medusa(model, path, NULL, &medusa) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(medusa == NULL);
  mp.max_draft = -1;
  CHECK(kiln_strategy_create_medusa(model, path, &mp, &medusa) == KILN_ERR_INVALID_ARGUMENT);

  /* EAGLE heads: defaults, a missing file, a file that is not a head, bad fields. */
  kiln_eagle_params ep;
  CHECK(kiln_eagle_params_init(&ep, sizeof ep) == KILN_OK);
  CHECK(ep.struct_size == sizeof ep && ep.top_k == 0 && ep.max_depth == 0 && ep.tree_tokens == 0 &&
        ep.n_threads == 1 && ep.merge_ngram == 1);
  CHECK(ep.typical_acceptance == 0 && ep.typical_epsilon == 0.09f && ep.typical_delta == 0.3f);
  /* A caller from before merge_ngram: its struct ends at n_threads, the field is not written. */
  ep.merge_ngram = 7;
  CHECK(kiln_eagle_params_init(&ep, offsetof(kiln_eagle_params, merge_ngram)) == KILN_OK);
  CHECK(ep.merge_ngram == 7 && ep.n_threads == 1);
  CHECK(kiln_eagle_params_init(&ep, 2) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(kiln_eagle_params_init(&ep, sizeof ep) == KILN_OK);
  kiln_strategy* eagle = NULL;
  CHECK(kiln_strategy_create_eagle(model, "/nonexistent/head.gguf", &ep, &eagle) == KILN_ERR_IO);
  CHECK(kiln_strategy_create_eagle(model, path, &ep, &eagle) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kiln_last_error_message(), "not an eagle head") != NULL);
  CHECK(kiln_strategy_create_eagle(model, path, NULL, &eagle) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(eagle == NULL);
  ep.top_k = 65;
  CHECK(kiln_strategy_create_eagle(model, path, &ep, &eagle) == KILN_ERR_INVALID_ARGUMENT);
  CHECK(eagle == NULL);
  kiln_model_destroy(model);
}

int main(void) {
  test_versions();
  test_cpu_info();
  const char* tmp = getenv("TMPDIR");
  test_bad_loads(tmp && *tmp ? tmp : "/tmp");
  char path[1024];
  const char* dir = getenv("KILN_MODEL_DIR");
  const char* home = getenv("HOME");
  if (dir && *dir) {
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
  } else {
    snprintf(path, sizeof path, "%s/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
  }
  test_model(path);
  if (g_failures) {
    fprintf(stderr, "c_api_test: %d failure(s)\n", g_failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
