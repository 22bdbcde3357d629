// The extern "C" layer: every entry point catches everything, maps absl::Status to kiln_status
// and records the message per thread. Handle structs live here and nowhere else.
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "include/kiln/kiln.h"
#include "kernels/cpu/per_thread.h"
#include "lib/backend/backend.h"
#include "lib/c_api/handles.h"
#include "lib/c_api/versioned_struct.h"
#include "lib/common/cpu_features.h"
#include "lib/common/status.h"
#include "lib/engine/scheduler.h"
#include "lib/gguf/gguf.h"
#include "lib/model/model.h"
#include "lib/quant/quant.h"
#include "lib/spec/draft_model_strategy.h"
#include "lib/spec/eagle_strategy.h"
#include "lib/spec/medusa_strategy.h"
#include "lib/spec/ngram_strategy.h"
#include "lib/tokenizer/chat_template.h"
#include "lib/tokenizer/tokenizer.h"

namespace {
// The message of this thread's last failed call (a type of its own for PerThread).
struct LastError {
  std::string message;
};
std::string& ThreadLastError() { return kiln::kernels::PerThread<LastError>().message; }
}  // namespace

kiln_status kiln::c_api::SetLastError(kiln_status status, std::string message) {
  ThreadLastError() = std::move(message);
  return status;
}

namespace {

using kiln::c_api::VersionedStruct;

kiln_status Fail(kiln_status status, std::string message) {
  return kiln::c_api::SetLastError(status, std::move(message));
}

kiln_status FromAbsl(const absl::Status& s) {
  if (s.ok()) return KILN_OK;
  kiln_status code = KILN_ERR_INTERNAL;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      code = KILN_ERR_INVALID_ARGUMENT;
      break;
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnavailable:
      code = KILN_ERR_IO;
      break;
    case absl::StatusCode::kDataLoss:
      code = KILN_ERR_FORMAT;
      break;
    case absl::StatusCode::kUnimplemented:
      code = KILN_ERR_UNSUPPORTED;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = KILN_ERR_CACHE_FULL;
      break;
    case absl::StatusCode::kCancelled:
      code = KILN_ERR_CANCELLED;
      break;
    case absl::StatusCode::kOutOfRange:
      code = KILN_ERR_OUT_OF_RANGE;
      break;
    case absl::StatusCode::kAborted:
      code = KILN_ERR_BUSY;
      break;
    default:
      break;
  }
  return Fail(code, std::string(s.message()));
}

// Runs `body` (returning kiln_status) so that no exception escapes.
template <typename Body>
kiln_status Guard(const char* fn, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(KILN_ERR_OUT_OF_MEMORY, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(KILN_ERR_INTERNAL, std::string(fn) + ": " + e.what());
  } catch (...) {
    return Fail(KILN_ERR_INTERNAL, std::string(fn) + ": unknown exception");
  }
}

// Copies `bytes` into a caller buffer with the two-call (size query) convention.
kiln_status CopyOut(const char* fn, std::string_view bytes, char* out, size_t capacity,
                    size_t* out_len) {
  *out_len = bytes.size();
  if (bytes.size() > capacity) {
    return Fail(KILN_ERR_BUFFER_TOO_SMALL,
                kiln::StrCat(fn, ": needs ", bytes.size(), " bytes, capacity is ", capacity));
  }
  if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  return KILN_OK;
}

// The BOS/EOS texts a chat template may print.
kiln::ChatTemplateTokens ChatTokensOf(const kiln::Tokenizer& tok) {
  kiln::ChatTemplateTokens t;
  if (tok.bos() >= 0) t.bos_token = std::string(tok.TokenText(tok.bos()));
  if (tok.eos() >= 0) t.eos_token = std::string(tok.TokenText(tok.eos()));
  return t;
}

// Defaults of each parameter struct: what its init function writes, and what a field outside a
// caller's struct_size reads as.
template <typename T>
T Defaults();

template <>
kiln_model_params Defaults() {
  kiln_model_params p = VersionedStruct<kiln_model_params>::Zeroed();
  p.use_mmap = 1;
  return p;
}

template <>
kiln_cache_params Defaults() {
  kiln_cache_params p = VersionedStruct<kiln_cache_params>::Zeroed();
  p.block_size = 16;
  p.kv_type = KILN_KV_F16;
  p.prefix_caching = 1;
  p.step_tokens = kiln::EngineOptions().step_tokens;
  return p;
}

template <>
kiln_sampler_params Defaults() {
  kiln_sampler_params p = VersionedStruct<kiln_sampler_params>::Zeroed();
  const kiln::sample::SamplerParams d;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.typical_p = d.typical_p;
  p.repeat_penalty = d.repeat_penalty;
  p.frequency_penalty = d.frequency_penalty;
  p.presence_penalty = d.presence_penalty;
  p.penalty_last_n = d.penalty_last_n;
  p.n_logprobs = d.n_logprobs;
  return p;
}

template <>
kiln_generate_params Defaults() {
  kiln_generate_params p = VersionedStruct<kiln_generate_params>::Zeroed();
  p.max_tokens = 128;
  return p;
}

template <>
kiln_ngram_params Defaults() {
  kiln_ngram_params p = VersionedStruct<kiln_ngram_params>::Zeroed();
  const kiln::spec::NgramParams d;
  p.max_ngram = d.max_ngram;
  p.min_ngram = d.min_ngram;
  p.max_draft = d.max_draft;
  p.start_draft = d.start_draft;
  p.max_skip = d.max_skip;
  p.adaptive = d.adaptive ? 1 : 0;
  p.fixed_pass_cost_beta = d.fixed_pass_cost_beta;
  return p;
}

template <>
kiln_draft_params Defaults() {
  kiln_draft_params p = VersionedStruct<kiln_draft_params>::Zeroed();
  const kiln::spec::DraftModelParams d;
  p.max_draft = d.max_draft;
  p.adaptive = d.adaptive ? 1 : 0;
  p.n_threads = d.n_threads;
  p.n_ctx = d.n_ctx;
  p.fixed_pass_cost_beta = d.fixed_pass_cost_beta;
  return p;
}

// Typical acceptance off, with Medusa's thresholds ready for a caller who turns it on.
template <typename HeadParams>
void SetTypicalDefaults(HeadParams* p) {
  const kiln::sample::TypicalAcceptance d;
  p->typical_acceptance = 0;
  p->typical_epsilon = d.epsilon;
  p->typical_delta = d.delta;
}

// The typical rule a head strategy's C params ask for (nullopt: exact verification).
template <typename HeadParams>
std::optional<kiln::sample::TypicalAcceptance> TypicalFrom(const HeadParams& p) {
  if (p.typical_acceptance == 0) return std::nullopt;
  return kiln::sample::TypicalAcceptance{p.typical_epsilon, p.typical_delta};
}

template <>
kiln_medusa_params Defaults() {
  kiln_medusa_params p = VersionedStruct<kiln_medusa_params>::Zeroed();
  const kiln::spec::MedusaParams d;
  p.max_draft = d.max_draft;
  p.n_threads = d.n_threads;
  p.merge_ngram = d.merge_ngram ? 1 : 0;
  SetTypicalDefaults(&p);
  return p;
}

template <>
kiln_eagle_params Defaults() {
  kiln_eagle_params p = VersionedStruct<kiln_eagle_params>::Zeroed();
  const kiln::spec::EagleParams d;
  p.top_k = d.top_k;
  p.max_depth = d.max_depth;
  p.tree_tokens = d.tree_tokens;
  p.n_threads = d.n_threads;
  p.merge_ngram = d.merge_ngram ? 1 : 0;
  SetTypicalDefaults(&p);
  return p;
}

template <>
kiln_request_params Defaults() {
  kiln_request_params p = VersionedStruct<kiln_request_params>::Zeroed();
  p.max_tokens = 128;
  return p;
}

template <>
kiln_step_params Defaults() {
  return VersionedStruct<kiln_step_params>::Zeroed();
}

template <>
kiln_state_params Defaults() {
  kiln_state_params p = VersionedStruct<kiln_state_params>::Zeroed();
  const kiln::SaveStateOptions d;
  p.kv = d.kv ? 1 : 0;
  p.strategy = d.strategy ? 1 : 0;
  return p;
}

// The body of every kiln_*_params_init.
template <typename T>
kiln_status InitParams(const char* fn, T* params, size_t struct_size) {
  return Guard(fn, [&]() -> kiln_status {
    if (params == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, kiln::StrCat(fn, ": params is NULL"));
    }
    return VersionedStruct<T>::Write(fn, "struct_size", Defaults<T>(), struct_size, params);
  });
}

// Reads a caller's parameter struct into *out (defaults past its struct_size).
template <typename T>
kiln_status ReadParams(const char* fn, const T* caller_params, T* out) {
  return VersionedStruct<T>::Read(fn, "params", caller_params, Defaults<T>(), out);
}

}  // namespace

extern "C" {

const char* kiln_version(void) {
  return KILN_STRINGIFY(KILN_VERSION_MAJOR) "." KILN_STRINGIFY(
      KILN_VERSION_MINOR) "." KILN_STRINGIFY(KILN_VERSION_PATCH);
}
int kiln_abi_version(void) { return KILN_ABI_VERSION; }

const char* kiln_cpu_info(void) {
  static const std::string info = std::string(kiln::CpuLevelName(kiln::BestCpuLevel())) + " (" +
                                  kiln::GetCpuFeatures().ToString() + ")";
  return info.c_str();
}

const char* kiln_status_name(kiln_status status) {
  switch (status) {
    case KILN_OK:
      return "KILN_OK";
    case KILN_ERR_INVALID_ARGUMENT:
      return "KILN_ERR_INVALID_ARGUMENT";
    case KILN_ERR_IO:
      return "KILN_ERR_IO";
    case KILN_ERR_FORMAT:
      return "KILN_ERR_FORMAT";
    case KILN_ERR_UNSUPPORTED:
      return "KILN_ERR_UNSUPPORTED";
    case KILN_ERR_OUT_OF_MEMORY:
      return "KILN_ERR_OUT_OF_MEMORY";
    case KILN_ERR_CACHE_FULL:
      return "KILN_ERR_CACHE_FULL";
    case KILN_ERR_CANCELLED:
      return "KILN_ERR_CANCELLED";
    case KILN_ERR_OUT_OF_RANGE:
      return "KILN_ERR_OUT_OF_RANGE";
    case KILN_ERR_BUFFER_TOO_SMALL:
      return "KILN_ERR_BUFFER_TOO_SMALL";
    case KILN_ERR_BUSY:
      return "KILN_ERR_BUSY";
    case KILN_ERR_INTERNAL:
      return "KILN_ERR_INTERNAL";
  }
  return "KILN_ERR_UNKNOWN";
}

const char* kiln_last_error_message(void) { return ThreadLastError().c_str(); }

// ------------------------------------------------------------------ model

kiln_status kiln_model_params_init(kiln_model_params* params, size_t struct_size) {
  return InitParams("kiln_model_params_init", params, struct_size);
}

kiln_status kiln_model_load(const kiln_model_params* caller_params, kiln_model** out_model) {
  return Guard("kiln_model_load", [&]() -> kiln_status {
    if (caller_params == nullptr || out_model == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_model_load: params and out_model are required");
    }
    kiln_model_params read;
    const kiln_status status = ReadParams("kiln_model_load", caller_params, &read);
    if (status != KILN_OK) return status;
    const kiln_model_params* params = &read;
    if (params->path == nullptr || params->path[0] == '\0') {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_model_load: params->path is empty");
    }
    kiln::ModelLoadOptions options;
    options.path = params->path;
    options.use_mmap = params->use_mmap != 0;
    if (params->progress) {
      options.progress = [fn = params->progress, ud = params->progress_user_data](float p) {
        return fn(p, ud) == 0;
      };
    }
    if (params->log) {
      options.log = [fn = params->log, ud = params->log_user_data](kiln::LogLevel level,
                                                                   std::string_view msg) {
        std::string line(msg);
        fn(static_cast<kiln_log_level>(level), line.c_str(), ud);
      };
    }
    auto model = kiln::Model::Load(options);
    if (!model.ok()) {
      // Everything but a missing file, a cancel or an unsupported feature is a bad file.
      kiln_status s = FromAbsl(model.status());
      if (s == KILN_ERR_INVALID_ARGUMENT) s = KILN_ERR_FORMAT;
      if (params->log) {
        params->log(KILN_LOG_ERROR, ThreadLastError().c_str(), params->log_user_data);
      }
      return s;
    }
    auto handle = std::make_unique<kiln_model>();
    handle->model = std::move(*model);
    const kiln::gguf::GgufFile& file = handle->model->file();
    for (const auto& kv : file.metadata()) {
      handle->meta_keys.push_back(kv.key);
      handle->meta_values.push_back(file.ValueToString(kv));
    }
    *out_model = handle.release();
    return KILN_OK;
  });
}

void kiln_model_destroy(kiln_model* model) { delete model; }

kiln_status kiln_gguf_open(const char* path, kiln_gguf** out) {
  return Guard("kiln_gguf_open", [&]() -> kiln_status {
    if (path == nullptr || out == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_gguf_open: path and out are required");
    }
    *out = nullptr;
    auto file = kiln::gguf::GgufFile::Open(path, {});
    if (!file.ok()) {
      kiln_status st = FromAbsl(file.status());
      return st == KILN_ERR_INVALID_ARGUMENT ? KILN_ERR_FORMAT : st;
    }
    auto handle = std::make_unique<kiln_gguf>();
    handle->file = std::move(*file);
    for (const auto& kv : handle->file->metadata()) {
      handle->meta_keys.push_back(kv.key);
      handle->meta_values.push_back(handle->file->ValueToString(kv));
    }
    for (const std::string& problem : kiln::Model::Unsupported(*handle->file)) {
      handle->unsupported += problem + "\n";
    }
    *out = handle.release();
    return KILN_OK;
  });
}

void kiln_gguf_destroy(kiln_gguf* gguf) { delete gguf; }

size_t kiln_gguf_meta_count(const kiln_gguf* gguf) { return gguf ? gguf->meta_keys.size() : 0; }

kiln_status kiln_gguf_meta_at(const kiln_gguf* gguf, size_t index, const char** key,
                              const char** value) {
  if (gguf == nullptr || key == nullptr || value == nullptr) {
    return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_gguf_meta_at: NULL argument");
  }
  if (index >= gguf->meta_keys.size()) {
    return Fail(KILN_ERR_OUT_OF_RANGE, kiln::StrCat("kiln_gguf_meta_at: index ", index,
                                                    " >= count ", gguf->meta_keys.size()));
  }
  *key = gguf->meta_keys[index].c_str();
  *value = gguf->meta_values[index].c_str();
  return KILN_OK;
}

const char* kiln_gguf_unsupported(const kiln_gguf* gguf) {
  return gguf ? gguf->unsupported.c_str() : "";
}

const char* kiln_backends(void) {
  static const std::string description = kiln::DescribeBackends();
  return description.c_str();
}

kiln_status kiln_model_get_info(const kiln_model* model, kiln_model_info* info) {
  return Guard("kiln_model_get_info", [&]() -> kiln_status {
    if (model == nullptr || info == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_model_get_info: model and info are required");
    }
    const kiln::ModelHparams& hp = model->model->hparams();
    const kiln::Tokenizer& tok = model->model->tokenizer();
    kiln_model_info out = VersionedStruct<kiln_model_info>::Zeroed();
    out.architecture = hp.arch.c_str();
    out.name = hp.name.c_str();
    out.n_params = static_cast<int64_t>(model->model->n_params());
    out.size_bytes = static_cast<int64_t>(model->model->weight_bytes());
    out.n_vocab = static_cast<int32_t>(hp.n_vocab);
    out.n_ctx_train = static_cast<int32_t>(hp.n_ctx_train);
    out.n_embd = static_cast<int32_t>(hp.n_embd);
    out.n_layer = static_cast<int32_t>(hp.n_layer);
    out.n_head = static_cast<int32_t>(hp.n_head);
    out.n_head_kv = static_cast<int32_t>(hp.n_head_kv);
    out.head_dim = static_cast<int32_t>(hp.head_dim);
    out.n_ff = static_cast<int32_t>(hp.n_ff);
    out.token_bos = tok.bos();
    out.token_eos = tok.eos();
    out.token_eot = tok.eot();
    return VersionedStruct<kiln_model_info>::WriteOutput("kiln_model_get_info", "info", out, info);
  });
}

size_t kiln_model_meta_count(const kiln_model* model) {
  return model ? model->meta_keys.size() : 0;
}

kiln_status kiln_model_meta_at(const kiln_model* model, size_t index, const char** key,
                               const char** value) {
  if (model == nullptr || key == nullptr || value == nullptr) {
    return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_model_meta_at: NULL argument");
  }
  if (index >= model->meta_keys.size()) {
    return Fail(KILN_ERR_OUT_OF_RANGE, kiln::StrCat("kiln_model_meta_at: index ", index,
                                                    " >= count ", model->meta_keys.size()));
  }
  *key = model->meta_keys[index].c_str();
  *value = model->meta_values[index].c_str();
  return KILN_OK;
}

kiln_status kiln_model_meta_get(const kiln_model* model, const char* key, const char** value) {
  if (model == nullptr || key == nullptr || value == nullptr) {
    return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_model_meta_get: NULL argument");
  }
  for (size_t i = 0; i < model->meta_keys.size(); ++i) {
    if (model->meta_keys[i] == key) {
      *value = model->meta_values[i].c_str();
      return KILN_OK;
    }
  }
  return Fail(KILN_ERR_OUT_OF_RANGE, kiln::StrCat("kiln_model_meta_get: no key '", key, "'"));
}

int kiln_model_token_is_eog(const kiln_model* model, int32_t token) {
  if (model == nullptr) return 0;
  const kiln::Tokenizer& tok = model->model->tokenizer();
  return token >= 0 && token < tok.n_vocab() && tok.IsEndOfGeneration(token) ? 1 : 0;
}

// ------------------------------------------------------------------ text

kiln_status kiln_tokenize(const kiln_model* model, const char* text, size_t text_len,
                          uint32_t flags, int32_t* tokens, size_t capacity, size_t* n_tokens) {
  return Guard("kiln_tokenize", [&]() -> kiln_status {
    if (model == nullptr || n_tokens == nullptr || (text == nullptr && text_len > 0) ||
        (tokens == nullptr && capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_tokenize: model and n_tokens are required; text/tokens may be NULL only "
                  "with zero length");
    }
    if (flags & ~(KILN_TOKENIZE_ADD_SPECIAL | KILN_TOKENIZE_PARSE_SPECIAL)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_tokenize: unknown flags");
    }
    auto ids = model->model->tokenizer().Encode(std::string_view(text ? text : "", text_len),
                                                flags & KILN_TOKENIZE_ADD_SPECIAL,
                                                flags & KILN_TOKENIZE_PARSE_SPECIAL);
    if (!ids.ok()) return FromAbsl(ids.status());
    *n_tokens = ids->size();
    if (ids->size() > capacity) {
      return Fail(KILN_ERR_BUFFER_TOO_SMALL, kiln::StrCat("kiln_tokenize: needs ", ids->size(),
                                                          " tokens, capacity is ", capacity));
    }
    if (!ids->empty()) std::memcpy(tokens, ids->data(), ids->size() * sizeof(int32_t));
    return KILN_OK;
  });
}

kiln_status kiln_detokenize(const kiln_model* model, const int32_t* tokens, size_t n_tokens,
                            uint32_t flags, char* text, size_t capacity, size_t* text_len) {
  return Guard("kiln_detokenize", [&]() -> kiln_status {
    if (model == nullptr || text_len == nullptr || (tokens == nullptr && n_tokens > 0) ||
        (text == nullptr && capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_detokenize: model and text_len are required; tokens/text may be NULL "
                  "only with zero length");
    }
    auto out = model->model->tokenizer().Decode(std::span<const int32_t>(tokens, n_tokens),
                                                flags & KILN_DETOKENIZE_RENDER_SPECIAL);
    if (!out.ok()) return FromAbsl(out.status());
    return CopyOut("kiln_detokenize", *out, text, capacity, text_len);
  });
}

kiln_status kiln_chat_apply_template(const kiln_model* model, const char* tmpl,
                                     const kiln_chat_message* messages, size_t n_messages,
                                     int add_generation_prompt, char* text, size_t capacity,
                                     size_t* text_len) {
  return Guard("kiln_chat_apply_template", [&]() -> kiln_status {
    if (model == nullptr || text_len == nullptr || (messages == nullptr && n_messages > 0) ||
        (text == nullptr && capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_chat_apply_template: NULL argument");
    }
    std::vector<kiln::ChatMessage> msgs;
    for (size_t i = 0; i < n_messages; ++i) {
      if (messages[i].role == nullptr || messages[i].content == nullptr) {
        return Fail(KILN_ERR_INVALID_ARGUMENT,
                    kiln::StrCat("kiln_chat_apply_template: message ", i, " has a NULL field"));
      }
      msgs.push_back({messages[i].role, messages[i].content});
    }
    std::string_view source = tmpl ? std::string_view(tmpl) : model->model->chat_template();
    if (source.empty()) {
      return Fail(KILN_ERR_UNSUPPORTED,
                  "kiln_chat_apply_template: the model has no chat template; pass one");
    }
    auto rendered = kiln::ApplyChatTemplate(source, msgs, add_generation_prompt != 0,
                                            ChatTokensOf(model->model->tokenizer()));
    if (!rendered.ok()) {
      kiln_status s = FromAbsl(rendered.status());
      // An unrecognised template is "unsupported", not a caller mistake.
      if (rendered.status().code() == absl::StatusCode::kUnimplemented) s = KILN_ERR_UNSUPPORTED;
      return s;
    }
    return CopyOut("kiln_chat_apply_template", *rendered, text, capacity, text_len);
  });
}

// ------------------------------------------------------------------ cache

kiln_status kiln_cache_params_init(kiln_cache_params* params, size_t struct_size) {
  return InitParams("kiln_cache_params_init", params, struct_size);
}

kiln_status kiln_cache_create(const kiln_model* model, const kiln_cache_params* caller_params,
                              kiln_cache** out_cache) {
  return Guard("kiln_cache_create", [&]() -> kiln_status {
    if (model == nullptr || caller_params == nullptr || out_cache == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_cache_create: model, params and out_cache are required");
    }
    kiln_cache_params read;
    const kiln_status status = ReadParams("kiln_cache_create", caller_params, &read);
    if (status != KILN_OK) return status;
    const kiln_cache_params* params = &read;
    kiln::EngineOptions options;
    options.pool_bytes = params->pool_bytes;
    options.block_size = params->block_size;
    // A C caller may store any int in the enum; reading an out-of-range value as the C++ enum
    // type is undefined, so read its bits.
    std::underlying_type_t<kiln_kv_type> kv_type;
    std::memcpy(&kv_type, &params->kv_type, sizeof kv_type);
    switch (kv_type) {
      case KILN_KV_F16:
        options.kv_type = kiln::GgmlType::kF16;
        break;
      case KILN_KV_F32:
        options.kv_type = kiln::GgmlType::kF32;
        break;
      case KILN_KV_BF16:
        options.kv_type = kiln::GgmlType::kBF16;
        break;
      case KILN_KV_Q8_0:
        options.kv_type = kiln::GgmlType::kQ8_0;
        break;
      default:
        return Fail(KILN_ERR_INVALID_ARGUMENT, kiln::StrCat("kiln_cache_create: params->kv_type ",
                                                            kv_type, " is not a kiln_kv_type"));
    }
    options.prefix_caching = params->prefix_caching != 0;
    options.n_ctx = params->n_ctx;
    if (params->n_threads < 0) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  kiln::StrCat("kiln_cache_create: params->n_threads ", params->n_threads, " < 0"));
    }
    options.n_threads = params->n_threads;
    options.llama_cpp_order = params->llama_cpp_order != 0;
    if (params->step_tokens < 1) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, kiln::StrCat("kiln_cache_create: params->step_tokens ",
                                                          params->step_tokens, " < 1"));
    }
    options.step_tokens = params->step_tokens;
    std::underlying_type_t<kiln_backend_kind> backend;
    std::memcpy(&backend, &params->backend, sizeof backend);
    switch (backend) {
      case KILN_BACKEND_CPU:
        options.backend = kiln::BackendKind::kCpu;
        break;
      case KILN_BACKEND_CUDA:
        options.backend = kiln::BackendKind::kCuda;
        break;
      case KILN_BACKEND_AUTO:
        options.backend = kiln::BackendKind::kAuto;
        break;
      default:
        return Fail(KILN_ERR_INVALID_ARGUMENT,
                    kiln::StrCat("kiln_cache_create: params->backend ", backend,
                                 " is not a kiln_backend_kind"));
    }
    options.cuda_device = params->cuda_device;
    std::underlying_type_t<kiln_mla_prefill> mla_prefill;
    std::memcpy(&mla_prefill, &params->mla_prefill, sizeof mla_prefill);
    switch (mla_prefill) {
      case KILN_MLA_PREFILL_ABSORBED:
        options.mla_prefill = kiln::MlaPrefillMode::kAbsorbed;
        break;
      case KILN_MLA_PREFILL_MEASURED:
        options.mla_prefill = kiln::MlaPrefillMode::kMeasured;
        break;
      default:
        return Fail(KILN_ERR_INVALID_ARGUMENT,
                    kiln::StrCat("kiln_cache_create: params->mla_prefill ", mla_prefill,
                                 " is not a kiln_mla_prefill (0 absorbed, 1 measured)"));
    }
    if (params->sliding_window_sessions < 0) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  kiln::StrCat("kiln_cache_create: params->sliding_window_sessions ",
                               params->sliding_window_sessions, " < 0"));
    }
    options.swa_full = params->swa_full != 0;
    options.pin_threads = params->pin_threads != 0;
    auto engine = kiln::Engine::Create(*model->model, options);
    if (!engine.ok()) {
      return FromAbsl(absl::Status(engine.status().code(),
                                   kiln::StrCat("kiln_cache_create: ", engine.status().message())));
    }
    auto handle = std::make_unique<kiln_cache>();
    handle->model = model;
    handle->engine = std::move(*engine);
    *out_cache = handle.release();
    return KILN_OK;
  });
}

void kiln_cache_destroy(kiln_cache* cache) { delete cache; }

const char* kiln_cache_backend(const kiln_cache* cache) {
  return cache == nullptr ? "" : cache->engine->BackendDescription().c_str();
}

kiln_status kiln_cache_get_stats(const kiln_cache* cache, kiln_cache_stats* stats) {
  return Guard("kiln_cache_get_stats", [&]() -> kiln_status {
    if (cache == nullptr || stats == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_cache_get_stats: cache and stats are required");
    }
    const kiln::KvCacheCounters c = cache->engine->Counters();
    kiln_cache_stats out = VersionedStruct<kiln_cache_stats>::Zeroed();
    out.n_ctx = cache->engine->n_ctx();
    out.block_size = cache->engine->options().block_size;
    out.blocks_total = c.blocks_total;
    out.blocks_free = c.blocks_free;
    out.blocks_used = c.blocks_used;
    out.blocks_cached = c.blocks_cached;
    out.n_sequences = c.num_sequences;
    out.prefix_lookups = c.prefix_lookups;
    out.prefix_query_tokens = c.prefix_query_tokens;
    out.prefix_hit_tokens = c.prefix_hit_tokens;
    out.evictions = c.evictions;
    out.bytes_per_token = c.bytes_per_token;
    out.block_bytes = c.block_bytes;
    out.kv_bytes_in_use = c.kv_bytes_in_use;
    out.sliding_blocks_total = 0;  // the sliding layers' blocks share the pool
    out.sliding_blocks_used = c.sliding_blocks_used;
    out.sliding_blocks_released = c.sliding_blocks_released;
    out.sliding_block_bytes = c.sliding_block_bytes;
    return VersionedStruct<kiln_cache_stats>::WriteOutput("kiln_cache_get_stats", "stats", out,
                                                          stats);
  });
}

// ------------------------------------------------------------------ sampler

kiln_status kiln_sampler_params_init(kiln_sampler_params* params, size_t struct_size) {
  return InitParams("kiln_sampler_params_init", params, struct_size);
}

kiln_status kiln_sampler_create(const kiln_sampler_params* caller_params,
                                kiln_sampler** out_sampler) {
  return Guard("kiln_sampler_create", [&]() -> kiln_status {
    if (caller_params == nullptr || out_sampler == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_sampler_create: params and out_sampler are required");
    }
    kiln_sampler_params read;
    const kiln_status status = ReadParams("kiln_sampler_create", caller_params, &read);
    if (status != KILN_OK) return status;
    const kiln_sampler_params* params = &read;
    if (params->logit_bias == nullptr && params->n_logit_bias > 0) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_sampler_create: params->logit_bias is NULL but n_logit_bias > 0");
    }
    auto handle = std::make_unique<kiln_sampler>();
    kiln::sample::SamplerParams& p = handle->params;
    p.temperature = params->temperature;
    p.top_k = params->top_k;
    p.top_p = params->top_p;
    p.min_p = params->min_p;
    p.typical_p = params->typical_p;
    p.repeat_penalty = params->repeat_penalty;
    p.frequency_penalty = params->frequency_penalty;
    p.presence_penalty = params->presence_penalty;
    p.penalty_last_n = params->penalty_last_n;
    p.n_logprobs = params->n_logprobs;
    for (size_t i = 0; i < params->n_logit_bias; ++i) {
      if (params->logit_bias[i].token < 0) {
        return Fail(KILN_ERR_INVALID_ARGUMENT,
                    kiln::StrCat("kiln_sampler_create: logit_bias[", i, "].token ",
                                 params->logit_bias[i].token, " < 0"));
      }
      p.logit_bias.push_back({params->logit_bias[i].token, params->logit_bias[i].bias});
    }
    absl::Status valid = kiln::sample::Sampler::Validate(p);
    if (!valid.ok()) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  kiln::StrCat("kiln_sampler_create: ", valid.message()));
    }
    handle->seed = params->seed;
    *out_sampler = handle.release();
    return KILN_OK;
  });
}

void kiln_sampler_destroy(kiln_sampler* sampler) { delete sampler; }

// ------------------------------------------------------------------ session

kiln_status kiln_session_create(const kiln_model* model, kiln_cache* cache,
                                const kiln_sampler* sampler, kiln_session** out_session) {
  return Guard("kiln_session_create", [&]() -> kiln_status {
    if (model == nullptr || cache == nullptr || out_session == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_create: model, cache and out_session are required");
    }
    if (cache->model != model) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_create: the cache was created for another model");
    }
    kiln::sample::SamplerParams params;
    uint64_t seed = 0;
    if (sampler != nullptr) {
      params = sampler->params;
      seed = sampler->seed;
      const int64_t n_vocab = model->model->hparams().n_vocab;
      for (size_t i = 0; i < params.logit_bias.size(); ++i) {
        if (params.logit_bias[i].token >= n_vocab) {
          return Fail(KILN_ERR_INVALID_ARGUMENT,
                      kiln::StrCat("kiln_session_create: sampler logit_bias[", i, "].token ",
                                   params.logit_bias[i].token, " >= n_vocab ", n_vocab));
        }
      }
    } else {
      params.temperature = 0.0f;  // greedy
    }
    auto session = kiln::Session::Create(*cache->engine, params, seed);
    if (!session.ok()) return FromAbsl(session.status());
    auto handle = std::make_unique<kiln_session>();
    handle->model = model;
    handle->cache = cache;
    handle->session = std::move(*session);
    *out_session = handle.release();
    return KILN_OK;
  });
}

void kiln_session_destroy(kiln_session* session) { delete session; }

kiln_status kiln_session_append_text(kiln_session* session, const char* text, size_t len,
                                     uint32_t flags) {
  return Guard("kiln_session_append_text", [&]() -> kiln_status {
    if (session == nullptr || (text == nullptr && len > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_append_text: session is required; text may be NULL only with "
                  "len 0");
    }
    if (flags & ~(KILN_TOKENIZE_ADD_SPECIAL | KILN_TOKENIZE_PARSE_SPECIAL)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_session_append_text: unknown flags");
    }
    return FromAbsl(session->session->AppendText(std::string_view(text ? text : "", len),
                                                 flags & KILN_TOKENIZE_ADD_SPECIAL,
                                                 flags & KILN_TOKENIZE_PARSE_SPECIAL));
  });
}

kiln_status kiln_session_append_tokens(kiln_session* session, const int32_t* tokens,
                                       size_t n_tokens) {
  return Guard("kiln_session_append_tokens", [&]() -> kiln_status {
    if (session == nullptr || (tokens == nullptr && n_tokens > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_append_tokens: session is required; tokens may be NULL only "
                  "with n_tokens 0");
    }
    return FromAbsl(session->session->AppendTokens(std::span<const int32_t>(tokens, n_tokens)));
  });
}

kiln_status kiln_session_append_tokens_scored(kiln_session* session, const int32_t* tokens,
                                              size_t n_tokens, float* logprobs) {
  return Guard("kiln_session_append_tokens_scored", [&]() -> kiln_status {
    if (session == nullptr || tokens == nullptr || logprobs == nullptr || n_tokens < 2) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_append_tokens_scored: session, tokens and logprobs are "
                  "required, n_tokens >= 2");
    }
    return FromAbsl(session->session->AppendTokensScored(std::span<const int32_t>(tokens, n_tokens),
                                                         std::span<float>(logprobs, n_tokens - 1)));
  });
}

kiln_status kiln_generate_params_init(kiln_generate_params* params, size_t struct_size) {
  return InitParams("kiln_generate_params_init", params, struct_size);
}

kiln_status kiln_session_generate(kiln_session* session, const kiln_generate_params* caller_params,
                                  kiln_generate_result* result) {
  return Guard("kiln_session_generate", [&]() -> kiln_status {
    if (session == nullptr || caller_params == nullptr || result == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_generate: session, params and result are required");
    }
    kiln_generate_params read;
    kiln_status status = ReadParams("kiln_session_generate", caller_params, &read);
    if (status != KILN_OK) return status;
    const kiln_generate_params* params = &read;
    // The result's size is checked before generating, so that a bad one changes nothing.
    status = VersionedStruct<kiln_generate_result>::CheckSize(
        "kiln_session_generate", "result->struct_size", result->struct_size);
    if (status != KILN_OK) return status;
    if (params->stop_strings == nullptr && params->n_stop_strings > 0) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_generate: params->stop_strings is NULL but n_stop_strings > 0");
    }
    kiln::GenerateOptions options;
    options.max_tokens = params->max_tokens;
    for (size_t i = 0; i < params->n_stop_strings; ++i) {
      if (params->stop_strings[i] == nullptr) {
        return Fail(KILN_ERR_INVALID_ARGUMENT,
                    kiln::StrCat("kiln_session_generate: stop_strings[", i, "] is NULL"));
      }
      options.stop_strings.emplace_back(params->stop_strings[i]);
    }
    if (params->callback != nullptr) {
      options.on_token = [fn = params->callback, ud = params->user_data](int32_t token,
                                                                         std::string_view piece) {
        return fn(token, piece.data(), piece.size(), ud) == 0;
      };
    }
    auto r = session->session->Generate(options);
    if (!r.ok()) return FromAbsl(r.status());
    kiln_generate_result out = VersionedStruct<kiln_generate_result>::Zeroed();
    out.n_tokens = r->n_tokens;
    out.stop_reason = static_cast<kiln_stop_reason>(static_cast<int>(r->reason));
    return VersionedStruct<kiln_generate_result>::WriteOutput("kiln_session_generate", "result",
                                                              out, result);
  });
}

kiln_status kiln_session_cancel(kiln_session* session) {
  if (session == nullptr) {
    return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_session_cancel: session is NULL");
  }
  session->session->Cancel();
  return KILN_OK;
}

kiln_status kiln_session_fork(kiln_session* session, kiln_session** out_session) {
  return Guard("kiln_session_fork", [&]() -> kiln_status {
    if (session == nullptr || out_session == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_fork: session and out_session are required");
    }
    auto fork = session->session->Fork();
    if (!fork.ok()) return FromAbsl(fork.status());
    auto handle = std::make_unique<kiln_session>();
    handle->model = session->model;
    handle->cache = session->cache;
    handle->session = std::move(*fork);
    *out_session = handle.release();
    return KILN_OK;
  });
}

kiln_status kiln_session_rewind(kiln_session* session, size_t n_tokens) {
  return Guard("kiln_session_rewind", [&]() -> kiln_status {
    if (session == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_session_rewind: session is NULL");
    }
    // Session::Rewind checks the count against the session (under its busy check); this only
    // keeps the conversion to int32_t exact.
    if (n_tokens > static_cast<size_t>(INT32_MAX)) {
      return Fail(KILN_ERR_OUT_OF_RANGE, kiln::StrCat("kiln_session_rewind: ", n_tokens,
                                                      " tokens requested, more than a session "
                                                      "can hold"));
    }
    return FromAbsl(session->session->Rewind(static_cast<int32_t>(n_tokens)));
  });
}

size_t kiln_session_n_tokens(const kiln_session* session) {
  if (session == nullptr) return 0;
  // No busy check: the published count is safe to read while another thread is inside a call.
  return static_cast<size_t>(session->session->published_n_tokens());
}

kiln_status kiln_session_get_tokens(const kiln_session* session, int32_t* tokens, size_t capacity,
                                    size_t* n_tokens) {
  return Guard("kiln_session_get_tokens", [&]() -> kiln_status {
    if (session == nullptr || n_tokens == nullptr || (tokens == nullptr && capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_get_tokens: session and n_tokens are required; tokens may be "
                  "NULL only with capacity 0");
    }
    kiln::Session::Use use(*session->session, "kiln_session_get_tokens", false);
    if (!use.status().ok()) return FromAbsl(use.status());
    const std::vector<int32_t>& t = session->session->tokens();
    *n_tokens = t.size();
    if (t.size() > capacity) {
      return Fail(KILN_ERR_BUFFER_TOO_SMALL,
                  kiln::StrCat("kiln_session_get_tokens: needs ", t.size(), " tokens, capacity is ",
                               capacity));
    }
    if (!t.empty()) std::memcpy(tokens, t.data(), t.size() * sizeof(int32_t));
    return KILN_OK;
  });
}

kiln_status kiln_session_get_logits(const kiln_session* session, const float** logits,
                                    int32_t* n_vocab) {
  return Guard("kiln_session_get_logits", [&]() -> kiln_status {
    if (session == nullptr || logits == nullptr || n_vocab == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_session_get_logits: NULL argument");
    }
    kiln::Session::Use use(*session->session, "kiln_session_get_logits", false);
    if (!use.status().ok()) return FromAbsl(use.status());
    std::span<const float> l = session->session->Logits();
    if (l.empty()) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_get_logits: no logits: the session is empty, or its last token "
                  "is not computed yet (after generate or rewind; append or generate computes "
                  "it)");
    }
    *logits = l.data();
    *n_vocab = static_cast<int32_t>(l.size());
    return KILN_OK;
  });
}

kiln_status kiln_session_get_logprobs(const kiln_session* session, kiln_token_logprob* out,
                                      size_t capacity, size_t* n) {
  return Guard("kiln_session_get_logprobs", [&]() -> kiln_status {
    if (session == nullptr || n == nullptr || (out == nullptr && capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_get_logprobs: session and n are required; out may be NULL only "
                  "with capacity 0");
    }
    kiln::Session::Use use(*session->session, "kiln_session_get_logprobs", false);
    if (!use.status().ok()) return FromAbsl(use.status());
    std::span<const kiln::sample::TokenLogprob> lp = session->session->LastLogprobs();
    *n = lp.size();
    if (lp.size() > capacity) {
      return Fail(KILN_ERR_BUFFER_TOO_SMALL,
                  kiln::StrCat("kiln_session_get_logprobs: needs ", lp.size(),
                               " entries, capacity is ", capacity));
    }
    for (size_t i = 0; i < lp.size(); ++i) out[i] = {lp[i].token, lp[i].logprob};
    return KILN_OK;
  });
}

// ------------------------------------------------------------------ non-blocking requests

kiln_status kiln_request_params_init(kiln_request_params* params, size_t struct_size) {
  return InitParams("kiln_request_params_init", params, struct_size);
}

kiln_status kiln_session_submit(kiln_session* session, const kiln_request_params* caller_params) {
  return Guard("kiln_session_submit", [&]() -> kiln_status {
    if (session == nullptr || caller_params == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_submit: session and params are required");
    }
    kiln_request_params p;
    const kiln_status status = ReadParams("kiln_session_submit", caller_params, &p);
    if (status != KILN_OK) return status;
    if ((p.text == nullptr && p.text_len > 0) || (p.tokens == nullptr && p.n_tokens > 0) ||
        (p.stop_strings == nullptr && p.n_stop_strings > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_submit: params->text, tokens and stop_strings may be NULL only "
                  "with a zero length");
    }
    if (p.text_flags & ~(KILN_TOKENIZE_ADD_SPECIAL | KILN_TOKENIZE_PARSE_SPECIAL)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_session_submit: unknown params->text_flags");
    }
    kiln::SubmitOptions options;
    if (p.text_len > 0) {
      auto ids = session->model->model->tokenizer().Encode(
          std::string_view(p.text, p.text_len), p.text_flags & KILN_TOKENIZE_ADD_SPECIAL,
          p.text_flags & KILN_TOKENIZE_PARSE_SPECIAL);
      if (!ids.ok()) return FromAbsl(ids.status());
      options.prompt = std::move(*ids);
    }
    options.prompt.insert(options.prompt.end(), p.tokens, p.tokens + p.n_tokens);
    options.generate.max_tokens = p.max_tokens;
    for (size_t i = 0; i < p.n_stop_strings; ++i) {
      if (p.stop_strings[i] == nullptr) {
        return Fail(KILN_ERR_INVALID_ARGUMENT,
                    kiln::StrCat("kiln_session_submit: stop_strings[", i, "] is NULL"));
      }
      options.generate.stop_strings.emplace_back(p.stop_strings[i]);
    }
    if (p.on_token != nullptr) {
      options.generate.on_token = [fn = p.on_token, ud = p.user_data](int32_t token,
                                                                      std::string_view piece) {
        return fn(token, piece.data(), piece.size(), ud) == 0;
      };
    }
    if (p.on_done != nullptr) {
      options.on_done = [fn = p.on_done, ud = p.user_data, session](const absl::Status& st,
                                                                    const kiln::GenerateResult& r) {
        if (st.ok()) {
          fn(session, KILN_OK, static_cast<kiln_stop_reason>(static_cast<int>(r.reason)),
             r.n_tokens, ud);
        } else {
          fn(session, FromAbsl(st), KILN_STOP_EOG, 0, ud);
        }
      };
    }
    return FromAbsl(session->session->Submit(std::move(options)));
  });
}

kiln_status kiln_session_poll(kiln_session* session, char* text, size_t text_capacity,
                              int32_t* tokens, size_t token_capacity, kiln_poll_result* result) {
  return Guard("kiln_session_poll", [&]() -> kiln_status {
    if (session == nullptr || result == nullptr || (text == nullptr && text_capacity > 0) ||
        (tokens == nullptr && token_capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_poll: session and result are required; text/tokens may be NULL "
                  "only with capacity 0");
    }
    kiln_status status = VersionedStruct<kiln_poll_result>::CheckSize(
        "kiln_session_poll", "result->struct_size", result->struct_size);
    if (status != KILN_OK) return status;
    kiln::PollResult r;
    status = FromAbsl(session->session->Poll(text_capacity, token_capacity, &r));
    if (status != KILN_OK) return status;
    if (!r.text.empty()) std::memcpy(text, r.text.data(), r.text.size());
    if (!r.tokens.empty()) std::memcpy(tokens, r.tokens.data(), r.tokens.size() * sizeof(int32_t));
    kiln_poll_result out = VersionedStruct<kiln_poll_result>::Zeroed();
    out.text_len = r.text.size();
    out.n_new_tokens = r.tokens.size();
    out.text_left = r.text_left;
    out.tokens_left = r.tokens_left;
    out.done = r.done ? 1 : 0;
    out.n_tokens = r.n_tokens;
    std::string message;
    if (r.done) {
      out.status = FromAbsl(r.status);  // records the request's message for this thread
      message = kiln_last_error_message();
      if (out.status == KILN_OK) {
        out.stop_reason = static_cast<kiln_stop_reason>(static_cast<int>(r.reason));
      }
    }
    status =
        VersionedStruct<kiln_poll_result>::WriteOutput("kiln_session_poll", "result", out, result);
    if (status == KILN_OK && out.status != KILN_OK) Fail(out.status, message);
    return status;
  });
}

kiln_status kiln_step_params_init(kiln_step_params* params, size_t struct_size) {
  return InitParams("kiln_step_params_init", params, struct_size);
}

kiln_status kiln_cache_step(kiln_cache* cache, const kiln_step_params* caller_params,
                            kiln_step_result* result) {
  return Guard("kiln_cache_step", [&]() -> kiln_status {
    if (cache == nullptr) return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_cache_step: cache is NULL");
    kiln_step_params p = Defaults<kiln_step_params>();
    if (caller_params != nullptr) {
      const kiln_status status = ReadParams("kiln_cache_step", caller_params, &p);
      if (status != KILN_OK) return status;
    }
    if (!(p.time_budget_ms >= 0.0) || p.step_tokens < 0) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  kiln::StrCat("kiln_cache_step: params->time_budget_ms ", p.time_budget_ms,
                               " must be >= 0 and params->step_tokens ", p.step_tokens, " >= 0"));
    }
    if (result != nullptr) {
      const kiln_status status = VersionedStruct<kiln_step_result>::CheckSize(
          "kiln_cache_step", "result->struct_size", result->struct_size);
      if (status != KILN_OK) return status;
    }
    if (kiln::Scheduler::InStep()) {
      return Fail(KILN_ERR_BUSY,
                  "kiln_cache_step: called from a callback of a step (steps do not nest)");
    }
    using Clock = std::chrono::steady_clock;
    kiln::Scheduler& scheduler = cache->engine->scheduler();
    const Clock::time_point start = Clock::now();
    kiln_step_result out = VersionedStruct<kiln_step_result>::Zeroed();
    if (scheduler.active_tasks() > 0) {
      const kiln::StepStats stats = scheduler.StepWithin(p.step_tokens, p.time_budget_ms / 1e3);
      out.n_steps = stats.worked;
      out.n_tokens = stats.tokens;
    }
    if (result == nullptr) return KILN_OK;
    out.n_active = scheduler.active_tasks();
    out.elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    return VersionedStruct<kiln_step_result>::WriteOutput("kiln_cache_step", "result", out, result);
  });
}

kiln_status kiln_cache_start_worker(kiln_cache* cache) {
  return Guard("kiln_cache_start_worker", [&]() -> kiln_status {
    if (cache == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_cache_start_worker: cache is NULL");
    }
    cache->engine->scheduler().StartWorker();
    return KILN_OK;
  });
}

kiln_status kiln_cache_stop_worker(kiln_cache* cache) {
  return Guard("kiln_cache_stop_worker", [&]() -> kiln_status {
    if (cache == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_cache_stop_worker: cache is NULL");
    }
    if (kiln::Scheduler::InStep()) {
      return Fail(KILN_ERR_BUSY,
                  "kiln_cache_stop_worker: called from a callback of a step (the worker would "
                  "wait for itself)");
    }
    cache->engine->scheduler().StopWorker();
    return KILN_OK;
  });
}

// ------------------------------------------------------------------ saved sessions

namespace {

// Reads optional state params (NULL: defaults) into SaveStateOptions.
kiln_status ReadStateParams(const char* fn, const kiln_state_params* caller_params,
                            kiln::SaveStateOptions* out) {
  kiln_state_params read = Defaults<kiln_state_params>();
  if (caller_params != nullptr) {
    const kiln_status status = ReadParams(fn, caller_params, &read);
    if (status != KILN_OK) return status;
  }
  out->kv = read.kv != 0;
  out->strategy = read.strategy != 0;
  return KILN_OK;
}

}  // namespace

kiln_status kiln_state_params_init(kiln_state_params* params, size_t struct_size) {
  return InitParams("kiln_state_params_init", params, struct_size);
}

kiln_status kiln_session_save_state(kiln_session* session, const kiln_state_params* params,
                                    void* buffer, size_t capacity, size_t* size) {
  return Guard("kiln_session_save_state", [&]() -> kiln_status {
    if (session == nullptr || size == nullptr || (buffer == nullptr && capacity > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_save_state: session and size are required; buffer may be NULL "
                  "only with capacity 0");
    }
    kiln::SaveStateOptions options;
    const kiln_status status = ReadStateParams("kiln_session_save_state", params, &options);
    if (status != KILN_OK) return status;
    auto state = session->session->SaveState(options);
    if (!state.ok()) return FromAbsl(state.status());
    *size = state->size();
    if (state->size() > capacity) {
      return Fail(KILN_ERR_BUFFER_TOO_SMALL,
                  kiln::StrCat("kiln_session_save_state: the state takes ", state->size(),
                               " bytes, capacity is ", capacity));
    }
    std::memcpy(buffer, state->data(), state->size());
    return KILN_OK;
  });
}

kiln_status kiln_session_load_state(kiln_session* session, const void* state, size_t size) {
  return Guard("kiln_session_load_state", [&]() -> kiln_status {
    if (session == nullptr || (state == nullptr && size > 0)) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_load_state: session is required; state may be NULL only with "
                  "size 0");
    }
    return FromAbsl(session->session->LoadState(
        std::string_view(state == nullptr ? "" : static_cast<const char*>(state), size)));
  });
}

kiln_status kiln_session_save_state_file(kiln_session* session, const kiln_state_params* params,
                                         const char* path) {
  return Guard("kiln_session_save_state_file", [&]() -> kiln_status {
    if (session == nullptr || path == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_save_state_file: session and path are required");
    }
    kiln::SaveStateOptions options;
    const kiln_status status = ReadStateParams("kiln_session_save_state_file", params, &options);
    if (status != KILN_OK) return status;
    absl::Status saved = session->session->SaveStateToFile(path, options);
    // Write failures of the file system have codes without a kiln meaning (kUnknown): report
    // them as I/O errors, not internal ones.
    if (saved.code() == absl::StatusCode::kUnknown)
      return Fail(KILN_ERR_IO, std::string(saved.message()));
    return FromAbsl(saved);
  });
}

kiln_status kiln_session_load_state_file(kiln_session* session, const char* path) {
  return Guard("kiln_session_load_state_file", [&]() -> kiln_status {
    if (session == nullptr || path == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_load_state_file: session and path are required");
    }
    absl::Status loaded = session->session->LoadStateFromFile(path);
    if (loaded.code() == absl::StatusCode::kUnknown)
      return Fail(KILN_ERR_IO, std::string(loaded.message()));
    return FromAbsl(loaded);
  });
}

// ------------------------------------------------------------------ speculative decoding

kiln_status kiln_ngram_params_init(kiln_ngram_params* params, size_t struct_size) {
  return InitParams("kiln_ngram_params_init", params, struct_size);
}

kiln_status kiln_strategy_create_ngram(const kiln_ngram_params* caller_params,
                                       kiln_strategy** out_strategy) {
  return Guard("kiln_strategy_create_ngram", [&]() -> kiln_status {
    if (caller_params == nullptr || out_strategy == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_strategy_create_ngram: params and out_strategy are required");
    }
    kiln_ngram_params read;
    const kiln_status status = ReadParams("kiln_strategy_create_ngram", caller_params, &read);
    if (status != KILN_OK) return status;
    const kiln_ngram_params* params = &read;
    kiln::spec::NgramParams p;
    p.max_ngram = params->max_ngram;
    p.min_ngram = params->min_ngram;
    p.max_draft = params->max_draft;
    p.start_draft = params->start_draft;
    p.max_skip = params->max_skip;
    p.adaptive = params->adaptive != 0;
    p.fixed_pass_cost_beta = params->fixed_pass_cost_beta;
    auto s = kiln::spec::NgramStrategy::Create(p);
    if (!s.ok()) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  kiln::StrCat("kiln_strategy_create_ngram: ", s.status().message()));
    }
    auto handle = std::make_unique<kiln_strategy>();
    handle->strategy = std::move(*s);
    *out_strategy = handle.release();
    return KILN_OK;
  });
}

kiln_status kiln_draft_params_init(kiln_draft_params* params, size_t struct_size) {
  return InitParams("kiln_draft_params_init", params, struct_size);
}

kiln_status kiln_strategy_create_draft(const kiln_model* target, const char* draft_path,
                                       const kiln_draft_params* caller_params,
                                       kiln_strategy** out_strategy) {
  return Guard("kiln_strategy_create_draft", [&]() -> kiln_status {
    if (target == nullptr || draft_path == nullptr || caller_params == nullptr ||
        out_strategy == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_strategy_create_draft: target, draft_path, params and out_strategy are "
                  "required");
    }
    kiln_draft_params read;
    const kiln_status status = ReadParams("kiln_strategy_create_draft", caller_params, &read);
    if (status != KILN_OK) return status;
    const kiln_draft_params* params = &read;
    kiln::spec::DraftModelParams p;
    p.max_draft = params->max_draft;
    p.adaptive = params->adaptive != 0;
    p.n_threads = params->n_threads;
    p.n_ctx = params->n_ctx;
    p.fixed_pass_cost_beta = params->fixed_pass_cost_beta;
    auto s = kiln::spec::DraftModelStrategy::Load(draft_path, target->model->hparams().n_vocab, p);
    if (!s.ok()) {
      return FromAbsl(absl::Status(
          s.status().code(), kiln::StrCat("kiln_strategy_create_draft: ", s.status().message())));
    }
    auto handle = std::make_unique<kiln_strategy>();
    handle->strategy = std::move(*s);
    *out_strategy = handle.release();
    return KILN_OK;
  });
}

kiln_status kiln_medusa_params_init(kiln_medusa_params* params, size_t struct_size) {
  return InitParams("kiln_medusa_params_init", params, struct_size);
}

kiln_status kiln_strategy_create_medusa(const kiln_model* target, const char* head_path,
                                        const kiln_medusa_params* caller_params,
                                        kiln_strategy** out_strategy) {
  return Guard("kiln_strategy_create_medusa", [&]() -> kiln_status {
    if (target == nullptr || head_path == nullptr || caller_params == nullptr ||
        out_strategy == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_strategy_create_medusa: target, head_path, params and out_strategy are "
                  "required");
    }
    kiln_medusa_params read;
    const kiln_status status = ReadParams("kiln_strategy_create_medusa", caller_params, &read);
    if (status != KILN_OK) return status;
    kiln::spec::MedusaParams p;
    p.max_draft = read.max_draft;
    p.n_threads = read.n_threads;
    p.merge_ngram = read.merge_ngram != 0;
    p.typical = TypicalFrom(read);
    auto s = kiln::spec::MedusaStrategy::Load(head_path, *target->model, p);
    if (!s.ok()) {
      return FromAbsl(absl::Status(
          s.status().code(), kiln::StrCat("kiln_strategy_create_medusa: ", s.status().message())));
    }
    auto handle = std::make_unique<kiln_strategy>();
    handle->strategy = std::move(*s);
    *out_strategy = handle.release();
    return KILN_OK;
  });
}

kiln_status kiln_eagle_params_init(kiln_eagle_params* params, size_t struct_size) {
  return InitParams("kiln_eagle_params_init", params, struct_size);
}

kiln_status kiln_strategy_create_eagle(const kiln_model* target, const char* head_path,
                                       const kiln_eagle_params* caller_params,
                                       kiln_strategy** out_strategy) {
  return Guard("kiln_strategy_create_eagle", [&]() -> kiln_status {
    if (target == nullptr || head_path == nullptr || caller_params == nullptr ||
        out_strategy == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_strategy_create_eagle: target, head_path, params and out_strategy are "
                  "required");
    }
    kiln_eagle_params read;
    const kiln_status status = ReadParams("kiln_strategy_create_eagle", caller_params, &read);
    if (status != KILN_OK) return status;
    kiln::spec::EagleParams p;
    p.top_k = read.top_k;
    p.max_depth = read.max_depth;
    p.tree_tokens = read.tree_tokens;
    p.n_threads = read.n_threads;
    p.merge_ngram = read.merge_ngram != 0;
    p.typical = TypicalFrom(read);
    auto s = kiln::spec::EagleStrategy::Load(head_path, *target->model, p);
    if (!s.ok()) {
      return FromAbsl(absl::Status(
          s.status().code(), kiln::StrCat("kiln_strategy_create_eagle: ", s.status().message())));
    }
    auto handle = std::make_unique<kiln_strategy>();
    handle->strategy = std::move(*s);
    *out_strategy = handle.release();
    return KILN_OK;
  });
}

void kiln_strategy_destroy(kiln_strategy* strategy) { delete strategy; }

kiln_status kiln_session_set_strategy(kiln_session* session, kiln_strategy* strategy) {
  return Guard("kiln_session_set_strategy", [&]() -> kiln_status {
    if (session == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT, "kiln_session_set_strategy: session is NULL");
    }
    return FromAbsl(
        session->session->SetStrategy(strategy == nullptr ? nullptr : strategy->strategy.get()));
  });
}

kiln_status kiln_session_get_spec_metrics(const kiln_session* session, kiln_spec_metrics* out) {
  return Guard("kiln_session_get_spec_metrics", [&]() -> kiln_status {
    if (session == nullptr || out == nullptr) {
      return Fail(KILN_ERR_INVALID_ARGUMENT,
                  "kiln_session_get_spec_metrics: session and out are required");
    }
    kiln::Session::Use use(*session->session, "kiln_session_get_spec_metrics", false);
    if (!use.status().ok()) return FromAbsl(use.status());
    const kiln::spec::SpecMetrics m = session->session->spec_metrics();
    kiln_spec_metrics metrics = VersionedStruct<kiln_spec_metrics>::Zeroed();
    metrics.steps = m.steps;
    metrics.drafted = m.drafted;
    metrics.accepted = m.accepted;
    metrics.generated = m.generated;
    metrics.mean_accepted_per_step = m.MeanAcceptedPerStep();
    metrics.target_passes_per_token = m.TargetPassesPerToken();
    metrics.accepted_lossy = m.accepted_lossy;
    return VersionedStruct<kiln_spec_metrics>::WriteOutput("kiln_session_get_spec_metrics", "out",
                                                           metrics, out);
  });
}

}  // extern "C"
