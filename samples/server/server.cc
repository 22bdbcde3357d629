// kiln-server: an OpenAI-compatible HTTP server on kiln's public C API (kiln/kiln.h) only.
//
// One model, one shared KV cache with prefix caching and the cache's worker thread. Each HTTP
// request gets its own kiln_session on that cache and runs blocking kiln_session_append_tokens /
// kiln_session_generate calls on its HTTP thread: with the worker started those calls wait for
// the worker's steps, and the worker runs one forward pass over every session that is
// generating, so concurrent requests are batched by kiln's scheduler. Blocking generates (rather
// than kiln_session_submit) are used because the generate callback may read the session's
// logprobs (kiln_session_get_logprobs), which a submitted request's callbacks may not.
//
// A request whose client goes away (a streaming write fails) stops at its next token and its
// session is destroyed at once. At most --parallel sessions live at a time; a request beyond
// that gets 503. Errors are OpenAI-style JSON: {"error": {"message", "type", "param", "code"}}.
#include <httplib.h>
#include <kiln/kiln.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;

// ------------------------------------------------------------------ configuration

struct Config {
  std::string model_path;
  std::string alias;  // the model id clients pass; default: the file name without .gguf
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed on stdout)
  int32_t threads = 0;
  int32_t ctx = 2048;     // most tokens per session
  int32_t parallel = 8;   // most live sessions; more requests get 503
  int64_t kv_tokens = 0;  // KV pool in tokens; 0: parallel * ctx
  std::string strategy = "none";
  int32_t draft_max = 0;  // n-gram --draft-max; 0: kiln's default
  int http_threads = 0;   // 0: 2 * parallel + 8
};

void Usage() {
  std::fprintf(stderr,
               "usage: kiln-server -m MODEL [options]\n"
               "  -m, --model PATH      GGUF model (required)\n"
               "  --alias NAME          model id served (default: file name without .gguf)\n"
               "  --host HOST           address to listen on (default 127.0.0.1)\n"
               "  --port N              port (default 8080; 0: a free port, printed on stdout)\n"
               "  -t, --threads N       compute threads (default: physical cores)\n"
               "  -c, --ctx N           most tokens per request: prompt + output (default 2048)\n"
               "  -np, --parallel N     most requests at once; more get 503 (default 8)\n"
               "  --kv-tokens N         KV pool size in tokens (default parallel * ctx)\n"
               "  --strategy S          speculative decoding: none (default) or ngram\n"
               "  --draft-max N         most draft tokens per step with ngram\n"
               "  --http-threads N      HTTP worker threads (default 2 * parallel + 8)\n");
}

bool ParseInt(const char* flag, const char* text, long long lo, long long hi, long long* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "kiln-server: bad value '%s' for %s (an integer in [%lld, %lld])\n", text,
                 flag, lo, hi);
    return false;
  }
  *out = v;
  return true;
}

// Returns 0 on success, 2 on a usage error (already printed).
int ParseArgs(int argc, char** argv, Config* cfg) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      Usage();
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "kiln-server: %s needs a value\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    long long n = 0;
    if (a == "-m" || a == "--model") {
      cfg->model_path = v;
    } else if (a == "--alias") {
      cfg->alias = v;
    } else if (a == "--host") {
      cfg->host = v;
    } else if (a == "--port") {
      if (!ParseInt(a.c_str(), v, 0, 65535, &n)) return 2;
      cfg->port = static_cast<int>(n);
    } else if (a == "-t" || a == "--threads") {
      if (!ParseInt(a.c_str(), v, 0, 1024, &n)) return 2;
      cfg->threads = static_cast<int32_t>(n);
    } else if (a == "-c" || a == "--ctx") {
      if (!ParseInt(a.c_str(), v, 16, 1 << 24, &n)) return 2;
      cfg->ctx = static_cast<int32_t>(n);
    } else if (a == "-np" || a == "--parallel") {
      if (!ParseInt(a.c_str(), v, 1, 4096, &n)) return 2;
      cfg->parallel = static_cast<int32_t>(n);
    } else if (a == "--kv-tokens") {
      if (!ParseInt(a.c_str(), v, 0, 1LL << 32, &n)) return 2;
      cfg->kv_tokens = n;
    } else if (a == "--strategy") {
      cfg->strategy = v;
      if (cfg->strategy != "none" && cfg->strategy != "ngram") {
        std::fprintf(stderr, "kiln-server: bad value '%s' for --strategy (none or ngram)\n", v);
        return 2;
      }
    } else if (a == "--draft-max") {
      if (!ParseInt(a.c_str(), v, 1, 256, &n)) return 2;
      cfg->draft_max = static_cast<int32_t>(n);
    } else if (a == "--http-threads") {
      if (!ParseInt(a.c_str(), v, 1, 65536, &n)) return 2;
      cfg->http_threads = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "kiln-server: unexpected argument '%s'\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (cfg->model_path.empty()) {
    Usage();
    return 2;
  }
  if (cfg->alias.empty()) {
    std::string base = cfg->model_path.substr(cfg->model_path.find_last_of('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0) {
      base.resize(base.size() - 5);
    }
    cfg->alias = base;
  }
  if (cfg->kv_tokens == 0) cfg->kv_tokens = static_cast<int64_t>(cfg->parallel) * cfg->ctx;
  if (cfg->http_threads == 0) cfg->http_threads = 2 * cfg->parallel + 8;
  return 0;
}

// ------------------------------------------------------------------ errors

// An error answered to the client: HTTP status and OpenAI's error object.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. "model_not_found", or empty
};

json ErrorJson(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}};
}

// JSON text; invalid UTF-8 (a token may end inside a character) becomes U+FFFD, never a throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(Dump(ErrorJson(e)), "application/json");
}

ApiError BadField(const std::string& param, const std::string& message) {
  ApiError e;
  e.param = param;
  e.message = message;
  return e;
}

// The message of the last kiln failure on this thread, prefixed with the status name.
std::string KilnMessage(kiln_status s) {
  return std::string(kiln_status_name(s)) + ": " + kiln_last_error_message();
}

// An error from a kiln call made for a request: full cache -> 503, context overflow and bad
// input -> 400, anything else -> 500.
ApiError FromKiln(kiln_status s, const std::string& what) {
  ApiError e;
  e.message = what + ": " + KilnMessage(s);
  if (s == KILN_ERR_CACHE_FULL) {
    e.http_status = 503;
    e.type = "server_error";
    e.code = "cache_full";
  } else if (s == KILN_ERR_OUT_OF_RANGE) {
    e.code = "context_length_exceeded";
  } else if (s != KILN_ERR_INVALID_ARGUMENT) {
    e.http_status = 500;
    e.type = "server_error";
  }
  return e;
}

// ------------------------------------------------------------------ request parsing

// What a completion request asks for, validated.
struct GenRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string prompt_text;     // rendered chat or the raw prompt
  uint32_t tokenize_flags = 0;
  int32_t max_tokens = -1;  // -1: until the context is full
  std::vector<std::string> stops;
  kiln_sampler_params sampler{};
  std::vector<kiln_logit_bias> logit_bias;
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// Reads body[key] as a number in [lo, hi] into *out when present and not null.
std::optional<ApiError> OptNumber(const json& body, const char* key, double lo, double hi,
                                  double* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return BadField(key, std::string("'") + key + "' must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return BadField(key, std::string("'") + key + "' must be in [" + json(lo).dump() + ", " +
                             json(hi).dump() + "], got " + it->dump());
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> OptInteger(const json& body, const char* key, int64_t lo, int64_t hi,
                                   int64_t* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    return BadField(key, std::string("'") + key + "' must be an integer");
  }
  const bool is_unsigned = it->is_number_unsigned();
  if (is_unsigned ? it->get<uint64_t>() > static_cast<uint64_t>(hi)
                  : (it->get<int64_t>() < lo || it->get<int64_t>() > hi)) {
    return BadField(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + it->dump());
  }
  *out = is_unsigned ? static_cast<int64_t>(it->get<uint64_t>()) : it->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> OptBool(const json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return BadField(key, std::string("'") + key + "' must be a boolean");
  *out = it->get<bool>();
  return std::nullopt;
}

// A chat message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> MessageText(const json& content, size_t index, std::string* out) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return BadField(param, param + " must be a string or an array");
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return BadField(param, param +
                                 ": only parts {\"type\": \"text\", \"text\": STRING} are "
                                 "supported");
    }
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

class Server {
 public:
  Server(Config cfg, kiln_model* model, kiln_cache* cache)
      : cfg_(std::move(cfg)), model_(model), cache_(cache) {
    kiln_model_info info;
    info.struct_size = sizeof info;
    kiln_model_get_info(model_, &info);
    n_vocab_ = info.n_vocab;
    for (int32_t t = 0; t < n_vocab_; ++t) {
      if (kiln_model_token_is_eog(model_, t)) eog_tokens_.push_back(t);
    }
    created_ = static_cast<int64_t>(std::time(nullptr));
  }

  void Register(httplib::Server& http);

 private:
  struct Job;
  std::optional<ApiError> ParseCommon(const json& body, bool chat, GenRequest* out);
  std::optional<ApiError> ParseChatPrompt(const json& body, GenRequest* out);
  std::optional<ApiError> ParseCompletionPrompt(const json& body, GenRequest* out);
  void HandleCompletion(const httplib::Request& req, httplib::Response& res, bool chat);
  std::string TokenText(int32_t token) const;
  json HealthJson() const;

  const Config cfg_;
  kiln_model* const model_;
  kiln_cache* const cache_;
  int32_t n_vocab_ = 0;
  std::vector<int32_t> eog_tokens_;  // what "ignore_eos" bans
  int64_t created_ = 0;
  std::atomic<int32_t> live_sessions_{0};
  std::atomic<int64_t> requests_total_{0};
  std::atomic<int64_t> requests_rejected_full_{0};
  std::atomic<int64_t> requests_disconnected_{0};
  std::atomic<int64_t> completion_tokens_total_{0};
  std::atomic<uint64_t> request_counter_{0};
};

std::optional<ApiError> Server::ParseCommon(const json& body, bool chat, GenRequest* out) {
  out->chat = chat;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return BadField("model", "'model' must be a string");
    if (it->get<std::string>() != cfg_.alias) {
      ApiError e;
      e.http_status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message = "The model '" + it->get<std::string>() +
                  "' does not exist; this server serves '" + cfg_.alias + "'";
      return e;
    }
  }
  if (auto e = OptBool(body, "stream", &out->stream)) return e;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return BadField("stream_options", "'stream_options' must be an object");
    if (auto e = OptBool(*it, "include_usage", &out->include_usage)) return e;
  }
  int64_t n = 1;
  if (auto e = OptInteger(body, "n", 1, 1, &n)) {
    e->message = "only n = 1 is supported";
    return e;
  }

  // Sampling: kiln's (llama.cpp's) defaults for what the request leaves out, as llama-server.
  kiln_sampler_params& sp = out->sampler;
  kiln_sampler_params_init(&sp, sizeof sp);
  double v = 0;
  if (auto e = OptNumber(body, "temperature", 0, 2, &v)) return e;
  if (body.contains("temperature") && !body["temperature"].is_null()) sp.temperature = float(v);
  if (auto e = OptNumber(body, "top_p", 0, 1, &v)) return e;
  if (body.contains("top_p") && !body["top_p"].is_null()) sp.top_p = float(v);
  if (auto e = OptNumber(body, "min_p", 0, 1, &v)) return e;
  if (body.contains("min_p") && !body["min_p"].is_null()) sp.min_p = float(v);
  if (auto e = OptNumber(body, "frequency_penalty", -2, 2, &v)) return e;
  if (body.contains("frequency_penalty") && !body["frequency_penalty"].is_null()) {
    sp.frequency_penalty = float(v);
  }
  if (auto e = OptNumber(body, "presence_penalty", -2, 2, &v)) return e;
  if (body.contains("presence_penalty") && !body["presence_penalty"].is_null()) {
    sp.presence_penalty = float(v);
  }
  int64_t i = 0;
  if (auto e = OptInteger(body, "top_k", 0, 1 << 20, &i)) return e;
  if (body.contains("top_k") && !body["top_k"].is_null()) sp.top_k = int32_t(i);
  // Without a seed each request draws one, as OpenAI's API does.
  sp.seed = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
  if (auto e = OptInteger(body, "seed", INT64_MIN, INT64_MAX, &i)) return e;
  if (body.contains("seed") && !body["seed"].is_null()) sp.seed = uint64_t(i);

  // max_completion_tokens is the newer name of max_tokens in the chat API.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto e = OptInteger(body, key, 0, 1 << 24, &i)) return e;
    if (body.contains(key) && !body[key].is_null()) out->max_tokens = int32_t(i);
  }

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      out->stops.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 16) {
      for (const json& s : *it) {
        if (!s.is_string()) return BadField("stop", "'stop' must hold strings");
        out->stops.push_back(s.get<std::string>());
      }
    } else {
      return BadField("stop", "'stop' must be a string or an array of at most 16 strings");
    }
    // kiln refuses empty stop strings; an empty one can never match, so it is dropped.
    std::erase_if(out->stops, [](const std::string& s) { return s.empty(); });
  }

  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return BadField("logit_bias", "'logit_bias' must be an object");
    for (auto& [key, bias] : it->items()) {
      long long token = 0;
      char* end = nullptr;
      errno = 0;
      token = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || errno != 0 || *end != '\0' || token < 0 || token >= n_vocab_) {
        return BadField("logit_bias", "logit_bias key '" + key + "' is not a token id in [0, " +
                                          std::to_string(n_vocab_) + ")");
      }
      if (!bias.is_number() || !(bias.get<double>() >= -100 && bias.get<double>() <= 100)) {
        return BadField("logit_bias", "logit_bias values must be numbers in [-100, 100]");
      }
      // OpenAI: -100 bans the token.
      const double b = bias.get<double>();
      out->logit_bias.push_back(
          {int32_t(token), b <= -100 ? -std::numeric_limits<float>::infinity() : float(b)});
    }
  }

  // llama-server's extension: never stop at an end-of-generation token (benchmarks).
  bool ignore_eos = false;
  if (auto e = OptBool(body, "ignore_eos", &ignore_eos)) return e;
  if (ignore_eos) {
    for (int32_t t : eog_tokens_) {
      out->logit_bias.push_back({t, -std::numeric_limits<float>::infinity()});
    }
  }

  // logprobs: a boolean with top_logprobs in [0, 20] (chat), an integer in [0, 5] (completions).
  if (chat) {
    if (auto e = OptBool(body, "logprobs", &out->logprobs)) return e;
    if (auto e = OptInteger(body, "top_logprobs", 0, 20, &i)) return e;
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
      out->top_logprobs = int32_t(i);
      if (!out->logprobs) {
        return BadField("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      }
    }
  } else {
    if (auto e = OptInteger(body, "logprobs", 0, 5, &i)) return e;
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
      out->logprobs = true;
      out->top_logprobs = int32_t(i);
    }
  }
  if (out->logprobs) {
    // kiln reports the top-n of the distribution each token was sampled from; the sampled
    // token's own log-probability is found among them when n covers every candidate the sampler
    // could pick (its top_k); without top_k, 100 covers all but negligible picks.
    const int32_t needed = sp.top_k > 0 ? sp.top_k : 100;
    sp.n_logprobs = std::max(needed, out->top_logprobs);
  }
  return std::nullopt;
}

std::optional<ApiError> Server::ParseChatPrompt(const json& body, GenRequest* out) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return BadField("messages", "'messages' must be a non-empty array");
  }
  std::vector<std::string> roles, contents;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& m = (*it)[k];
    const std::string param = "messages[" + std::to_string(k) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return BadField(param, param + " must be an object with a string 'role'");
    }
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant") {
      return BadField(param + ".role",
                      "unsupported role '" + role + "' (system, developer, user or assistant)");
    }
    std::string text;
    if (auto e = MessageText(m.value("content", json()), k, &text)) return e;
    roles.push_back(role);
    contents.push_back(std::move(text));
  }
  std::vector<kiln_chat_message> messages;
  for (size_t k = 0; k < roles.size(); ++k) {
    messages.push_back({roles[k].c_str(), contents[k].c_str()});
  }
  size_t len = 0;
  kiln_status s = kiln_chat_apply_template(model_, nullptr, messages.data(), messages.size(), 1,
                                           nullptr, 0, &len);
  if (s == KILN_ERR_BUFFER_TOO_SMALL) {
    out->prompt_text.resize(len);
    s = kiln_chat_apply_template(model_, nullptr, messages.data(), messages.size(), 1,
                                 out->prompt_text.data(), len, &len);
  }
  if (s != KILN_OK) return FromKiln(s, "applying the chat template");
  // The template writes BOS itself when the model wants one; its control tokens are parsed.
  out->tokenize_flags = KILN_TOKENIZE_PARSE_SPECIAL;
  return std::nullopt;
}

std::optional<ApiError> Server::ParseCompletionPrompt(const json& body, GenRequest* out) {
  auto it = body.find("prompt");
  if (it != body.end() && it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    out->prompt_text = (*it)[0].get<std::string>();
  } else if (it != body.end() && it->is_string()) {
    out->prompt_text = it->get<std::string>();
  } else {
    return BadField("prompt", "'prompt' must be a string (or an array of one string)");
  }
  // As llama-server: BOS as the vocabulary asks, special tokens in the text parsed.
  out->tokenize_flags = KILN_TOKENIZE_ADD_SPECIAL | KILN_TOKENIZE_PARSE_SPECIAL;
  return std::nullopt;
}

std::string Server::TokenText(int32_t token) const {
  char buf[256];
  size_t len = 0;
  if (kiln_detokenize(model_, &token, 1, 0, buf, sizeof buf, &len) != KILN_OK) return {};
  return std::string(buf, len);
}

// ------------------------------------------------------------------ one request's session

// One request's kiln objects. Destroying the Job destroys its session at once (a disconnected
// client's request is dropped with the HTTP response that owns the Job) and frees its slot.
struct Server::Job {
  Server* server = nullptr;
  GenRequest request;
  std::string id;
  kiln_sampler* sampler = nullptr;
  kiln_strategy* strategy = nullptr;
  kiln_session* session = nullptr;
  size_t prompt_tokens = 0;
  bool holds_slot = false;

  // Destroys the session (before its strategy, which it uses) and frees the slot. Idempotent.
  void Release() {
    kiln_session_destroy(session);
    session = nullptr;
    kiln_strategy_destroy(strategy);
    strategy = nullptr;
    kiln_sampler_destroy(sampler);
    sampler = nullptr;
    if (holds_slot) server->live_sessions_.fetch_sub(1);
    holds_slot = false;
  }
  ~Job() { Release(); }
};

// One generated token as the client sees it.
struct TokenOut {
  std::string text;    // may be empty (held back by kiln) or hold held-back text
  int32_t token = -1;  // -1: the final flush of held-back text
  float logprob = 0;
  std::vector<kiln_token_logprob> top;
};

json ChatLogprobEntry(const TokenOut& t, const std::string& token_text,
                      const std::vector<std::string>& top_texts) {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
  };
  json top = json::array();
  for (size_t k = 0; k < t.top.size(); ++k) {
    top.push_back({{"token", top_texts[k]},
                   {"logprob", t.top[k].logprob},
                   {"bytes", bytes_of(top_texts[k])}});
  }
  return {{"token", token_text},
          {"logprob", t.logprob},
          {"bytes", bytes_of(token_text)},
          {"top_logprobs", top}};
}

const char* FinishReason(kiln_stop_reason r) {
  return (r == KILN_STOP_MAX_TOKENS || r == KILN_STOP_CONTEXT_FULL) ? "length" : "stop";
}

void Server::HandleCompletion(const httplib::Request& req, httplib::Response& res, bool chat) {
  requests_total_.fetch_add(1);
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::parse_error& e) {
    SendError(res, BadField("", std::string("the body is not valid JSON: ") + e.what()));
    return;
  }
  if (!body.is_object()) {
    SendError(res, BadField("", "the body must be a JSON object"));
    return;
  }
  auto job = std::make_shared<Job>();
  job->server = this;
  GenRequest& r = job->request;
  if (auto e = ParseCommon(body, chat, &r)) return SendError(res, *e);
  if (auto e = chat ? ParseChatPrompt(body, &r) : ParseCompletionPrompt(body, &r)) {
    return SendError(res, *e);
  }

  // A slot, or 503 at once: queueing behind --parallel sessions would only hide overload.
  if (live_sessions_.fetch_add(1) >= cfg_.parallel) {
    live_sessions_.fetch_sub(1);
    requests_rejected_full_.fetch_add(1);
    ApiError e;
    e.http_status = 503;
    e.type = "server_error";
    e.code = "server_busy";
    e.message = "all " + std::to_string(cfg_.parallel) + " slots are busy; retry later";
    res.set_header("Retry-After", "1");
    return SendError(res, e);
  }
  job->holds_slot = true;

  std::vector<int32_t> tokens;
  size_t n = 0;
  kiln_status s = kiln_tokenize(model_, r.prompt_text.data(), r.prompt_text.size(),
                                r.tokenize_flags, nullptr, 0, &n);
  if (s == KILN_ERR_BUFFER_TOO_SMALL || s == KILN_OK) {
    tokens.resize(n);
    s = kiln_tokenize(model_, r.prompt_text.data(), r.prompt_text.size(), r.tokenize_flags,
                      tokens.data(), tokens.size(), &n);
  }
  if (s != KILN_OK) return SendError(res, FromKiln(s, "tokenizing the prompt"));
  if (tokens.empty()) return SendError(res, BadField("prompt", "the prompt is empty"));
  job->prompt_tokens = tokens.size();
  if (tokens.size() >= size_t(cfg_.ctx)) {
    ApiError e = BadField(chat ? "messages" : "prompt",
                          "the prompt has " + std::to_string(tokens.size()) +
                              " tokens; this server's context is " + std::to_string(cfg_.ctx) +
                              " tokens (prompt and output)");
    e.code = "context_length_exceeded";
    return SendError(res, e);
  }

  r.sampler.logit_bias = r.logit_bias.data();
  r.sampler.n_logit_bias = r.logit_bias.size();
  if ((s = kiln_sampler_create(&r.sampler, &job->sampler)) != KILN_OK) {
    return SendError(res, FromKiln(s, "creating the sampler"));
  }
  if ((s = kiln_session_create(model_, cache_, job->sampler, &job->session)) != KILN_OK) {
    return SendError(res, FromKiln(s, "creating the session"));
  }
  if (cfg_.strategy == "ngram") {
    kiln_ngram_params np;
    kiln_ngram_params_init(&np, sizeof np);
    if (cfg_.draft_max > 0) {
      np.max_draft = cfg_.draft_max;
      np.start_draft = std::min(np.start_draft, np.max_draft);
    }
    if ((s = kiln_strategy_create_ngram(&np, &job->strategy)) != KILN_OK ||
        (s = kiln_session_set_strategy(job->session, job->strategy)) != KILN_OK) {
      return SendError(res, FromKiln(s, "setting up the n-gram strategy"));
    }
  }
  // The prompt is computed here, before the response starts, so that a full cache or an
  // over-long prompt still gets its own HTTP status. The worker batches it with other requests.
  if ((s = kiln_session_append_tokens(job->session, tokens.data(), tokens.size())) != KILN_OK) {
    return SendError(res, FromKiln(s, "computing the prompt"));
  }

  const int32_t room = cfg_.ctx - int32_t(tokens.size());
  const int32_t max_tokens = r.max_tokens < 0 ? room : std::min(r.max_tokens, room);
  const uint64_t serial = request_counter_.fetch_add(1);
  char id[64];
  std::snprintf(id, sizeof id, "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(created_), static_cast<unsigned long long>(serial));
  job->id = id;
  const int64_t created = static_cast<int64_t>(std::time(nullptr));

  // Runs the generation, handing each token to `emit` (false: the client is gone, stop).
  // Returns the kiln status and fills the stop reason and token count.
  auto generate = [this, job, max_tokens](const std::function<bool(TokenOut&)>& emit,
                                          kiln_generate_result* result) {
    struct Ctx {
      Job* job;
      const std::function<bool(TokenOut&)>* emit;
      bool client_gone = false;
    } ctx{job.get(), &emit};
    std::vector<const char*> stops;
    for (const std::string& st : job->request.stops) stops.push_back(st.c_str());
    kiln_generate_params gp;
    kiln_generate_params_init(&gp, sizeof gp);
    gp.max_tokens = max_tokens;
    gp.stop_strings = stops.empty() ? nullptr : stops.data();
    gp.n_stop_strings = stops.size();
    gp.user_data = &ctx;
    gp.callback = [](int32_t token, const char* piece, size_t len, void* user) -> int {
      Ctx* c = static_cast<Ctx*>(user);
      TokenOut t;
      t.token = token;
      t.text.assign(piece, len);
      if (token >= 0 && c->job->request.logprobs) {
        std::vector<kiln_token_logprob> all(size_t(c->job->request.sampler.n_logprobs));
        size_t n_lp = 0;
        if (kiln_session_get_logprobs(c->job->session, all.data(), all.size(), &n_lp) == KILN_OK) {
          all.resize(n_lp);
          // Not among the candidates (possible only without top_k): the smallest listed
          // log-probability bounds it from above.
          t.logprob = all.empty() ? 0.0f : all.back().logprob;
          for (const kiln_token_logprob& lp : all) {
            if (lp.token == token) t.logprob = lp.logprob;
          }
          all.resize(std::min(all.size(), size_t(c->job->request.top_logprobs)));
          t.top = std::move(all);
        }
      }
      if (!(*c->emit)(t)) {
        c->client_gone = true;
        return 1;
      }
      return 0;
    };
    result->struct_size = sizeof *result;
    const kiln_status st = kiln_session_generate(job->session, &gp, result);
    if (ctx.client_gone) requests_disconnected_.fetch_add(1);
    if (st == KILN_OK) completion_tokens_total_.fetch_add(result->n_tokens);
    return st;
  };

  auto usage_json = [job](int32_t completion) {
    return json{{"prompt_tokens", job->prompt_tokens},
                {"completion_tokens", completion},
                {"total_tokens", int64_t(job->prompt_tokens) + completion}};
  };
  // The logprobs JSON of the tokens emitted by one callback (chat or completions layout).
  auto token_texts = [this](const TokenOut& t, std::string* token_text,
                            std::vector<std::string>* top_texts) {
    *token_text = TokenText(t.token);
    for (const kiln_token_logprob& lp : t.top) top_texts->push_back(TokenText(lp.token));
  };

  if (!r.stream) {
    std::string text;
    json chat_lp = json::array();
    json cmp_tokens = json::array(), cmp_lps = json::array(), cmp_top = json::array(),
         cmp_offsets = json::array();
    auto emit = [&](TokenOut& t) {
      if (t.token >= 0 && job->request.logprobs) {
        std::string tt;
        std::vector<std::string> tops;
        token_texts(t, &tt, &tops);
        if (chat) {
          chat_lp.push_back(ChatLogprobEntry(t, tt, tops));
        } else {
          json top = json::object();
          for (size_t k = 0; k < t.top.size(); ++k) top[tops[k]] = t.top[k].logprob;
          cmp_tokens.push_back(tt);
          cmp_lps.push_back(t.logprob);
          cmp_top.push_back(top);
          cmp_offsets.push_back(text.size());
        }
      }
      text += t.text;
      return true;
    };
    kiln_generate_result result;
    s = generate(emit, &result);
    if (s != KILN_OK) return SendError(res, FromKiln(s, "generating"));
    json choice = {{"index", 0}, {"finish_reason", FinishReason(result.stop_reason)}};
    json out = {{"id", job->id}, {"created", created}, {"model", cfg_.alias}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
      choice["logprobs"] = r.logprobs ? json{{"content", chat_lp}} : json(nullptr);
      out["object"] = "chat.completion";
    } else {
      choice["text"] = text;
      choice["logprobs"] = r.logprobs ? json{{"tokens", cmp_tokens},
                                             {"token_logprobs", cmp_lps},
                                             {"top_logprobs", cmp_top},
                                             {"text_offset", cmp_offsets}}
                                      : json(nullptr);
      out["object"] = "text_completion";
    }
    out["choices"] = json::array({choice});
    out["usage"] = usage_json(result.n_tokens);
    res.set_content(Dump(out), "application/json");
    return;
  }

  // Streaming (server-sent events): one chunk per token, the finish reason, usage if asked,
  // then [DONE]. The generation runs inside the content provider, after the headers are sent.
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, job, generate, usage_json, token_texts, chat, created](
                               size_t, httplib::DataSink& sink) {
        const GenRequest& rq = job->request;
        auto send = [&sink](const json& j) {
          const std::string line = "data: " + Dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto chunk = [&](json choice) {
          choice["index"] = 0;
          if (!choice.contains("finish_reason")) choice["finish_reason"] = nullptr;
          return json{{"id", job->id},
                      {"object", chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created},
                      {"model", cfg_.alias},
                      {"choices", json::array({choice})}};
        };
        if (chat && !send(chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}}))) {
          requests_disconnected_.fetch_add(1);
          sink.done();
          return false;
        }
        size_t text_offset = 0;
        auto emit = [&](TokenOut& t) {
          json lp = nullptr;
          if (t.token >= 0 && rq.logprobs) {
            std::string tt;
            std::vector<std::string> tops;
            token_texts(t, &tt, &tops);
            if (chat) {
              lp = {{"content", json::array({ChatLogprobEntry(t, tt, tops)})}};
            } else {
              json top = json::object();
              for (size_t k = 0; k < t.top.size(); ++k) top[tops[k]] = t.top[k].logprob;
              lp = {{"tokens", json::array({tt})},
                    {"token_logprobs", json::array({t.logprob})},
                    {"top_logprobs", json::array({top})},
                    {"text_offset", json::array({text_offset})}};
            }
          }
          text_offset += t.text.size();
          // Text held back by kiln (a partial character or a possible stop string) and no
          // logprobs: nothing to send for this token.
          if (t.text.empty() && lp.is_null()) return true;
          json choice = chat ? json{{"delta", {{"content", t.text}}}, {"logprobs", lp}}
                             : json{{"text", t.text}, {"logprobs", lp}};
          return send(chunk(choice));
        };
        kiln_generate_result result;
        const kiln_status st = generate(emit, &result);
        // Free the session and slot before the last events: a client that has read [DONE]
        // finds its slot free.
        job->Release();
        bool ok = true;
        if (st != KILN_OK) {
          ok = send(ErrorJson(FromKiln(st, "generating")));
        } else if (result.stop_reason != KILN_STOP_CALLBACK) {
          json last = chat ? json{{"delta", json::object()}} : json{{"text", ""}};
          last["finish_reason"] = FinishReason(result.stop_reason);
          ok = send(chunk(last));
          if (ok && rq.include_usage) {
            json u = chunk(json::object());
            u["choices"] = json::array();
            u["usage"] = usage_json(result.n_tokens);
            ok = send(u);
          }
          static const char kDone[] = "data: [DONE]\n\n";
          if (ok) ok = sink.write(kDone, sizeof kDone - 1);
        } else {
          ok = false;
        }
        if (ok) sink.done();
        return ok;
      });
}

json Server::HealthJson() const {
  kiln_cache_stats st;
  st.struct_size = sizeof st;
  kiln_cache_get_stats(cache_, &st);
  return {{"status", "ok"},
          {"model", cfg_.alias},
          {"strategy", cfg_.strategy},
          {"live_sessions", live_sessions_.load()},
          {"max_sessions", cfg_.parallel},
          {"requests_total", requests_total_.load()},
          {"requests_rejected_full", requests_rejected_full_.load()},
          {"requests_disconnected", requests_disconnected_.load()},
          {"completion_tokens_total", completion_tokens_total_.load()},
          {"cache",
           {{"n_ctx", st.n_ctx},
            {"blocks_total", st.blocks_total},
            {"blocks_used", st.blocks_used},
            {"blocks_cached", st.blocks_cached},
            {"n_sequences", st.n_sequences},
            {"prefix_query_tokens", st.prefix_query_tokens},
            {"prefix_hit_tokens", st.prefix_hit_tokens},
            {"evictions", st.evictions}}}};
}

void Server::Register(httplib::Server& http) {
  http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) {
    HandleCompletion(q, s, true);
  });
  http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) {
    HandleCompletion(q, s, false);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) {
    json m = {{"id", cfg_.alias}, {"object", "model"}, {"created", created_}, {"owned_by", "kiln"}};
    s.set_content(Dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  http.Get("/v1/models/(.+)", [this](const httplib::Request& q, httplib::Response& s) {
    if (q.matches[1] != cfg_.alias) {
      ApiError e;
      e.http_status = 404;
      e.code = "model_not_found";
      e.param = "model";
      e.message = "The model '" + std::string(q.matches[1]) + "' does not exist";
      return SendError(s, e);
    }
    s.set_content(
        Dump(
            {{"id", cfg_.alias}, {"object", "model"}, {"created", created_}, {"owned_by", "kiln"}}),
        "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
    s.set_content(Dump(HealthJson()), "application/json");
  });
  // Unknown routes and methods, and anything a handler left without a body: JSON errors too.
  http.set_error_handler([](const httplib::Request& q, httplib::Response& s) {
    if (!s.body.empty() || s.is_chunked_content_provider_) return;
    ApiError e;
    e.http_status = s.status;
    e.message = s.status == 404 ? "no route " + q.method + " " + q.path
                                : "HTTP error " + std::to_string(s.status);
    if (s.status >= 500) e.type = "server_error";
    s.set_content(Dump(ErrorJson(e)), "application/json");
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& s, std::exception_ptr ep) {
        ApiError e;
        e.http_status = 500;
        e.type = "server_error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          e.message = std::string("internal error: ") + ex.what();
        } catch (...) {
          e.message = "internal error";
        }
        SendError(s, e);
      });
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (int rc = ParseArgs(argc, argv, &cfg); rc != 0) return rc;

  // SIGINT/SIGTERM are taken by one thread (sigwait) that stops the HTTP server, so shutdown
  // runs on the main thread and frees everything. Blocked before any other thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not a dead server

  kiln_model_params mp;
  kiln_model_params_init(&mp, sizeof mp);
  mp.path = cfg.model_path.c_str();
  kiln_model* model = nullptr;
  kiln_status s = kiln_model_load(&mp, &model);
  if (s != KILN_OK) {
    std::fprintf(stderr, "kiln-server: loading %s: %s\n", cfg.model_path.c_str(),
                 KilnMessage(s).c_str());
    return 1;
  }
  kiln_cache_params cp;
  kiln_cache_params_init(&cp, sizeof cp);
  cp.n_ctx = cfg.ctx;
  cp.n_threads = cfg.threads;
  cp.prefix_caching = 1;
  // The pool in bytes needs the model's bytes per token, which a cache reports.
  kiln_cache* cache = nullptr;
  kiln_cache_stats st;
  st.struct_size = sizeof st;
  cp.pool_bytes = 0;
  cp.n_ctx = 16;
  if ((s = kiln_cache_create(model, &cp, &cache)) == KILN_OK) {
    kiln_cache_get_stats(cache, &st);
    kiln_cache_destroy(cache);
    cache = nullptr;
    cp.n_ctx = cfg.ctx;
    cp.pool_bytes = size_t(cfg.kv_tokens) * st.bytes_per_token;
    s = kiln_cache_create(model, &cp, &cache);
  }
  if (s == KILN_OK) s = kiln_cache_start_worker(cache);
  if (s != KILN_OK) {
    std::fprintf(stderr, "kiln-server: creating the cache: %s\n", KilnMessage(s).c_str());
    kiln_cache_destroy(cache);
    kiln_model_destroy(model);
    return 1;
  }

  int rc = 0;
  {
    Server server(cfg, model, cache);
    httplib::Server http;
    const size_t http_threads = size_t(cfg.http_threads);
    http.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
    http.set_tcp_nodelay(true);
    http.set_keep_alive_timeout(2);
    http.set_payload_max_length(size_t(16) << 20);  // 16 MiB: more than any prompt fits in ctx
    server.Register(http);
    // Debian's cpp-httplib is a compiled library that listens with a backlog of 5: with dozens of
    // clients connecting at once the accept queue overflowed and connections were reset. Calling
    // listen again on the bound socket raises the backlog (Linux takes the newer value).
    int listen_fd = -1;
    http.set_socket_options([&listen_fd](socket_t fd) {
      httplib::default_socket_options(fd);
      listen_fd = fd;
    });
    int port = cfg.port;
    bool bound = port == 0 ? (port = http.bind_to_any_port(cfg.host)) > 0
                           : http.bind_to_port(cfg.host, port);
    if (bound && listen(listen_fd, SOMAXCONN) != 0) {
      std::fprintf(stderr, "kiln-server: listen backlog: %s\n", std::strerror(errno));
      bound = false;
    }
    if (!bound) {
      std::fprintf(stderr, "kiln-server: cannot listen on %s:%d\n", cfg.host.c_str(), cfg.port);
      rc = 1;
    } else {
      kiln_cache_get_stats(cache, &st);
      std::printf(
          "kiln-server: listening on http://%s:%d (model %s, %d slots of %d tokens, "
          "%d KV blocks, strategy %s)\n",
          cfg.host.c_str(), port, cfg.alias.c_str(), cfg.parallel, cfg.ctx, st.blocks_total,
          cfg.strategy.c_str());
      std::fflush(stdout);
      std::atomic<bool> signalled{false};
      std::thread stopper([&http, &stop_signals, &signalled] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        signalled = true;
        http.stop();
      });
      http.listen_after_bind();
      // listen returned without a signal (a socket error): a pending SIGTERM ends the stopper.
      if (!signalled) kill(getpid(), SIGTERM);
      stopper.join();
      std::printf("kiln-server: stopped\n");
    }
  }
  kiln_cache_destroy(cache);
  kiln_model_destroy(model);
  return rc;
}
