#include "lib/session/session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lib/common/platform.h"
#include "lib/engine/speculative_decoder.h"
#include "lib/session/session_state.h"
#include "lib/tokenizer/streaming_detokenizer.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {

// ------------------------------------------------------------------ Session::Use

Session::Use::Use(const Session& session, const char* what, bool mutating)
    : session_(session), mutating_(mutating) {
  const std::thread::id self = std::this_thread::get_id();
  // A mutating call drops a cancel that arrived before it. The flag is cleared before the session
  // is taken, so that a cancel sent as soon as the session shows busy is never lost; when the
  // session turns out to be busy, a cancel meant for the call in flight is put back.
  const bool dropped_cancel =
      mutating && session.cancel_.exchange(false, std::memory_order_acq_rel);
  std::thread::id expected{};
  if (session.owner_.compare_exchange_strong(expected, self, std::memory_order_acq_rel)) {
    owns_ = true;
    return;
  }
  if (dropped_cancel) session.cancel_.store(true, std::memory_order_release);
  if (expected == self) {
    if (mutating) {
      status_ = absl::AbortedError(absl::StrCat(
          what, ": the session is busy: called from inside its own generate callback"));
    }
    return;  // a read-only call from the generate callback
  }
  status_ = absl::AbortedError(
      absl::StrCat(what,
                   ": the session is busy: another thread is inside a call on it (a session "
                   "must be used by one thread at a time)"));
}

Session::Use::~Use() {
  if (!owns_) return;
  if (mutating_) session_.PublishNTokens(session_.tokens_.size());
  session_.owner_.store(std::thread::id(), std::memory_order_release);
}

// ------------------------------------------------------------------ Session

Session::Session(Engine& engine, const sample::SamplerParams& params, uint64_t seed, SeqId seq)
    : engine_(engine),
      n_vocab_(engine.model().hparams().n_vocab),
      seq_(seq),
      sampler_(params),
      rng_(seed) {}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(Engine& engine,
                                                         const sample::SamplerParams& params,
                                                         uint64_t seed) {
  KILN_RETURN_IF_ERROR(sample::Sampler::Validate(params));
  const SeqId seq =
      engine.Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
  return std::unique_ptr<Session>(new Session(engine, params, seed, seq));
}

absl::Status Session::SetStrategy(spec::Strategy* strategy) {
  Use use(*this, "SetStrategy", true);
  KILN_RETURN_IF_ERROR(use.status());
  // A strategy newly attached to this session forgets what it learned elsewhere (a handle may
  // serve one session after another): its estimates and, for a draft model, its cache. Without
  // this, a reused handle made the next session's draft lengths, and so a seeded sampled text,
  // depend on the sessions before it.
  const bool first = spec_ == nullptr;
  if (first) {
    spec_ = std::make_unique<spec::SpeculativeDecoder>(engine_, seq_, sampler_, rng_, strategy);
  }
  if (strategy != nullptr && (first || strategy != spec_->strategy())) strategy->Reset();
  spec_->set_strategy(strategy);
  if (owned_strategy_ != nullptr && owned_strategy_.get() != strategy) owned_strategy_.reset();
  return absl::OkStatus();
}

spec::Strategy* Session::spec_strategy() const {
  return spec_ == nullptr ? nullptr : spec_->strategy();
}

spec::PassCostModel* Session::spec_cost_model() {
  return spec_ == nullptr ? nullptr : &spec_->cost_model();
}

spec::SpecMetrics Session::spec_metrics() const {
  return spec_ == nullptr ? spec::SpecMetrics{} : spec_->metrics();
}

Session::~Session() {
  engine_.Locked([&](KvCache& cache, ForwardPass&) { return cache.Free(seq_); }).IgnoreError();
}

absl::Status Session::CheckTokens(std::span<const int32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab_) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " at index ", i,
                                                     " is outside [0, n_vocab = ", n_vocab_, ")"));
    }
  }
  return absl::OkStatus();
}

std::span<const float> Session::Logits() const {
  if (!logits_valid_ || n_cached_ != n_tokens() || n_cached_ == 0) return {};
  return logits_;
}

void Session::RestoreTo(size_t n_tokens, int32_t n_cached) {
  engine_
      .Locked([&](KvCache& cache, ForwardPass&) -> absl::Status {
        auto len = cache.Length(seq_);
        if (len.ok() && *len > n_cached) return cache.Truncate(seq_, n_cached);
        return absl::OkStatus();
      })
      .IgnoreError();
  if (n_cached < n_cached_) logits_valid_ = false;
  tokens_.resize(n_tokens);
  n_cached_ = n_cached;
}

absl::Status Session::ComputePending(std::span<float> scores, int32_t score_from) {
  const int32_t n = n_tokens();
  if (n_cached_ == n) return absl::OkStatus();
  const bool scoring = !scores.empty();
  if (engine_.options().prefix_caching && n_cached_ == 0 && !scoring) {
    // Attach the longest cached prefix of tokens[0, n - 1): the last token is always computed so
    // that its logits exist.
    auto attached = engine_.Locked([&](KvCache& cache, ForwardPass&) -> absl::StatusOr<int32_t> {
      KILN_ASSIGN_OR_RETURN(int32_t len, cache.Length(seq_));
      if (len != 0) return 0;
      return cache.AttachCachedPrefix(seq_, std::span(tokens_).first(n - 1));
    });
    if (!attached.ok()) return attached.status();
    if (*attached > 0) logits_valid_ = false;
    n_cached_ += *attached;
    stats_.attached_tokens += *attached;
  }
  PrefillRequest request;
  request.seq = seq_;
  request.tokens = std::span(tokens_).subspan(n_cached_);
  request.logits_from = scoring ? std::max(0, score_from - n_cached_) : INT32_MAX;
  const int32_t base = n_cached_;
  request.on_logits = [&](int32_t index, const float* row) {
    const int32_t i = base + index;
    if (scoring && i >= score_from && i + 1 < n) {
      double max_logit = row[0];
      for (int64_t v = 1; v < n_vocab_; ++v) max_logit = std::max<double>(max_logit, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < n_vocab_; ++v) sum += std::exp(row[v] - max_logit);
      scores[i - score_from] = static_cast<float>(row[tokens_[i + 1]] - max_logit - std::log(sum));
    }
    if (i == n - 1) {
      logits_.assign(row, row + n_vocab_);
      logits_valid_ = true;
    }
  };
  request.cancelled = [this] { return ConsumeCancel(); };
  int32_t done = 0;
  absl::Status st = engine_.Prefill(request, &done);
  stats_.computed_tokens += done;
  n_cached_ += done;
  if (absl::IsCancelled(st)) {
    return absl::CancelledError(
        absl::StrCat("cancelled after ", n_cached_, " of ", n, " tokens were computed"));
  }
  return st;
}

absl::Status Session::AppendText(std::string_view text, bool add_special, bool parse_special) {
  Use use(*this, "AppendText", true);
  KILN_RETURN_IF_ERROR(use.status());
  auto ids = engine_.model().tokenizer().Encode(text, add_special, parse_special);
  if (!ids.ok()) return ids.status();
  return AppendTokensHeld(*ids);
}

absl::Status Session::AppendTokens(std::span<const int32_t> tokens) {
  Use use(*this, "AppendTokens", true);
  KILN_RETURN_IF_ERROR(use.status());
  return AppendTokensHeld(tokens);
}

absl::Status Session::AppendTokensHeld(std::span<const int32_t> tokens) {
  KILN_RETURN_IF_ERROR(CheckTokens(tokens));
  if (tokens_.size() + tokens.size() > static_cast<size_t>(engine_.n_ctx())) {
    return absl::OutOfRangeError(
        absl::StrCat("appending ", tokens.size(), " tokens to ", tokens_.size(),
                     " would pass the context size n_ctx = ", engine_.n_ctx()));
  }
  if (tokens.empty()) return absl::OkStatus();
  const size_t saved_tokens = tokens_.size();
  const int32_t saved_cached = n_cached_;
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  absl::Status st = ComputePending({}, 0);
  if (!st.ok()) RestoreTo(saved_tokens, saved_cached);
  return st;
}

absl::Status Session::AppendTokensScored(std::span<const int32_t> tokens,
                                         std::span<float> logprobs) {
  Use use(*this, "AppendTokensScored", true);
  KILN_RETURN_IF_ERROR(use.status());
  if (tokens.size() < 2 || logprobs.size() != tokens.size() - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AppendTokensScored: needs at least 2 tokens and tokens - 1 outputs (got ",
                     tokens.size(), " tokens, ", logprobs.size(), " outputs)"));
  }
  KILN_RETURN_IF_ERROR(CheckTokens(tokens));
  if (tokens_.size() + tokens.size() > static_cast<size_t>(engine_.n_ctx())) {
    return absl::OutOfRangeError(
        absl::StrCat("appending ", tokens.size(), " tokens to ", tokens_.size(),
                     " would pass the context size n_ctx = ", engine_.n_ctx()));
  }
  const size_t saved_tokens = tokens_.size();
  const int32_t saved_cached = n_cached_;
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  absl::Status st = ComputePending(logprobs, static_cast<int32_t>(saved_tokens));
  if (!st.ok()) RestoreTo(saved_tokens, saved_cached);
  return st;
}

absl::StatusOr<GenerateResult> Session::Generate(const GenerateOptions& options) {
  Use use(*this, "Generate", true);
  KILN_RETURN_IF_ERROR(use.status());
  if (options.max_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GenerateOptions.max_tokens ", options.max_tokens, " < 0"));
  }
  for (size_t i = 0; i < options.stop_strings.size(); ++i) {
    if (options.stop_strings[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GenerateOptions.stop_strings[", i, "] is empty"));
    }
  }
  if (tokens_.empty()) {
    return absl::FailedPreconditionError("Generate: the session is empty; append a prompt first");
  }
  const Tokenizer& tokenizer = engine_.model().tokenizer();
  StreamingDetokenizer detok(tokenizer);
  std::string held;  // decoded text not emitted yet (it may start a stop string)
  auto emit = [&](int32_t token, std::string_view text) {
    return !options.on_token || options.on_token(token, text);
  };
  GenerateResult result;
  // Handles one generated token already in tokens_: end of generation, stop strings, streaming.
  // Returns true when generation stops (result.reason set).
  auto handle = [&](int32_t token) -> absl::StatusOr<bool> {
    ++result.n_tokens;
    if (tokenizer.IsEndOfGeneration(token)) {
      result.reason = StopReason::kEndOfGeneration;
      return true;
    }
    KILN_ASSIGN_OR_RETURN(std::string piece, detok.Push(token));
    held += piece;
    size_t stop_at = std::string::npos;
    for (const std::string& s : options.stop_strings) stop_at = std::min(stop_at, held.find(s));
    if (stop_at != std::string::npos) {
      emit(token, std::string_view(held).substr(0, stop_at));
      held.clear();
      result.reason = StopReason::kStopString;
      return true;
    }
    // Hold back the longest suffix that could still grow into a stop string.
    size_t keep = 0;
    for (const std::string& s : options.stop_strings) {
      for (size_t len = std::min(s.size() - 1, held.size()); len > keep; --len) {
        if (held.compare(held.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
    const std::string out = held.substr(0, held.size() - keep);
    held.erase(0, held.size() - keep);
    if (!emit(token, out)) {
      result.reason = StopReason::kCallback;
      return true;
    }
    return false;
  };
  while (true) {
    if (result.n_tokens >= options.max_tokens) {
      result.reason = StopReason::kMaxTokens;
      break;
    }
    if (n_cached_ == n_tokens() && !logits_valid_) {
      // After a Rewind or a prefix attach: recompute the last token to get its logits.
      KILN_RETURN_IF_ERROR(engine_.Locked(
          [&](KvCache& cache, ForwardPass&) { return cache.Truncate(seq_, n_cached_ - 1); }));
      --n_cached_;
    }
    if (spec_ != nullptr && spec_->strategy() != nullptr && n_cached_ + 1 == n_tokens() &&
        n_tokens() < engine_.n_ctx()) {
      // Speculative step: computes the pending token with the strategy's drafts and appends the
      // accepted tokens plus one recovered/bonus token (pending again).
      if (ConsumeCancel()) {
        result.reason = StopReason::kCancelled;
        break;
      }
      const int32_t max_emit =
          std::min(options.max_tokens - result.n_tokens, engine_.n_ctx() - n_tokens());
      spec::SpecStepResult step;
      KILN_RETURN_IF_ERROR(spec_->Step(&tokens_, max_emit, &step));
      n_cached_ = n_tokens() - 1;
      logits_valid_ = false;
      stats_.computed_tokens += 1 + step.drafted;
      const int32_t first = n_tokens() - static_cast<int32_t>(step.emitted.size());
      bool stop = false;
      for (int32_t i = first; i < n_tokens() && !stop; ++i) {
        if (!step.logprobs.empty()) last_logprobs_ = std::move(step.logprobs[i - first]);
        PublishNTokens(static_cast<size_t>(i + 1));
        KILN_ASSIGN_OR_RETURN(stop, handle(tokens_[i]));
        if (stop && i + 1 < n_tokens()) {
          // Drop the tokens after the stopping one (their K/V too); the stopping token stays
          // computed, its logits are recomputed by the next Generate.
          RestoreTo(static_cast<size_t>(i + 1), std::min(n_cached_, i + 1));
        }
      }
      if (stop) break;
      continue;
    }
    if (n_cached_ < n_tokens()) {
      absl::Status st = ComputePending({}, 0);
      if (absl::IsCancelled(st)) {
        result.reason = StopReason::kCancelled;
        break;
      }
      KILN_RETURN_IF_ERROR(st);
    } else if (ConsumeCancel()) {
      result.reason = StopReason::kCancelled;
      break;
    }
    if (n_tokens() >= engine_.n_ctx()) {
      if (result.n_tokens == 0) {
        return absl::OutOfRangeError(absl::StrCat(
            "Generate: the session already holds n_ctx = ", engine_.n_ctx(), " tokens"));
      }
      result.reason = StopReason::kContextFull;
      break;
    }
    KILN_RETURN_IF_ERROR(sampler_.Apply(logits_, tokens_, &dist_));
    const int32_t token = sample::Sampler::Sample(dist_, rng_);
    if (token < 0) return absl::InternalError("Generate: the sampler returned no token");
    last_logprobs_ = dist_.top_logprobs;
    tokens_.push_back(token);  // pending: computed by the next step or call
    PublishNTokens(tokens_.size());
    KILN_ASSIGN_OR_RETURN(bool stop, handle(token));
    if (stop) break;
  }
  if (result.reason != StopReason::kStopString && result.reason != StopReason::kCallback) {
    held += detok.Flush();
    if (!held.empty()) emit(-1, held);
  }
  return result;
}

absl::StatusOr<std::unique_ptr<Session>> Session::Fork() {
  Use use(*this, "Fork", true);
  KILN_RETURN_IF_ERROR(use.status());
  KILN_ASSIGN_OR_RETURN(
      SeqId seq, engine_.Locked([&](KvCache& cache, ForwardPass&) { return cache.Fork(seq_); }));
  std::unique_ptr<Session> fork(new Session(engine_, sampler_.params(), 0, seq));
  fork->rng_ = rng_;
  fork->tokens_ = tokens_;
  fork->PublishNTokens(fork->tokens_.size());
  fork->n_cached_ = n_cached_;
  fork->logits_ = logits_;
  fork->logits_valid_ = logits_valid_;
  fork->last_logprobs_ = last_logprobs_;
  if (spec_ != nullptr) {
    fork->spec_ = std::make_unique<spec::SpeculativeDecoder>(fork->engine_, fork->seq_,
                                                             fork->sampler_, fork->rng_, nullptr);
    fork->spec_->cost_model() = spec_->cost_model();
    if (spec_->strategy() != nullptr) {
      // On failure the fork (and its forked sequence) is destroyed here.
      KILN_ASSIGN_OR_RETURN(fork->owned_strategy_, spec_->strategy()->Clone());
      fork->spec_->set_strategy(fork->owned_strategy_.get());
    }
  }
  return fork;
}

// ------------------------------------------------------------------ saved state

namespace {

std::string ModelDescription(const Model& model) {
  const ModelHparams& hp = model.hparams();
  return kiln::StrCat(hp.arch, " '", hp.name, "', ", hp.n_layer, " layers, vocab ", hp.n_vocab);
}

void SamplerParamsToProto(const sample::SamplerParams& p, state::SamplerParams* out) {
  for (const sample::LogitBias& b : p.logit_bias) {
    state::LogitBias* o = out->add_logit_bias();
    o->set_token(b.token);
    o->set_bias(b.bias);
  }
  out->set_penalty_last_n(p.penalty_last_n);
  out->set_repeat_penalty(p.repeat_penalty);
  out->set_frequency_penalty(p.frequency_penalty);
  out->set_presence_penalty(p.presence_penalty);
  out->set_top_k(p.top_k);
  out->set_typical_p(p.typical_p);
  out->set_top_p(p.top_p);
  out->set_min_p(p.min_p);
  out->set_temperature(p.temperature);
  out->set_n_logprobs(p.n_logprobs);
}

sample::SamplerParams SamplerParamsFromProto(const state::SamplerParams& p) {
  sample::SamplerParams out;
  for (const state::LogitBias& b : p.logit_bias()) out.logit_bias.push_back({b.token(), b.bias()});
  out.penalty_last_n = p.penalty_last_n();
  out.repeat_penalty = p.repeat_penalty();
  out.frequency_penalty = p.frequency_penalty();
  out.presence_penalty = p.presence_penalty();
  out.top_k = p.top_k();
  out.typical_p = p.typical_p();
  out.top_p = p.top_p();
  out.min_p = p.min_p();
  out.temperature = p.temperature();
  out.n_logprobs = p.n_logprobs();
  return out;
}

void CostToProto(const spec::PassCostModel& cost, state::PassCostState* out) {
  const spec::PassCostModel::Snapshot s = cost.snapshot();
  out->set_t1(s.t1);
  out->set_slope(s.slope);
  for (double t : s.t_width) out->add_t_width(t);
  for (int64_t at : s.seen_at) out->add_seen_at(at);
  out->set_n1(s.n1);
  out->set_n_wide(s.n_wide);
  out->set_pinned(s.pinned);
  out->set_pinned_beta(s.pinned_beta);
}

// Precondition: state::Decode accepted it (the arrays have kMaxTimedWidth + 1 entries).
spec::PassCostModel::Snapshot CostFromProto(const state::PassCostState& c) {
  spec::PassCostModel::Snapshot s;
  s.t1 = c.t1();
  s.slope = c.slope();
  for (size_t i = 0; i < s.t_width.size(); ++i) {
    s.t_width[i] = c.t_width(static_cast<int>(i));
    s.seen_at[i] = c.seen_at(static_cast<int>(i));
  }
  s.n1 = c.n1();
  s.n_wide = c.n_wide();
  s.pinned = c.pinned();
  s.pinned_beta = c.pinned_beta();
  return s;
}

}  // namespace

absl::StatusOr<std::string> Session::SaveState(const SaveStateOptions& options) {
  Use use(*this, "SaveState", true);
  KILN_RETURN_IF_ERROR(use.status());
  const Model& model = engine_.model();
  state::SessionState st;
  st.mutable_model()->set_hash(state::ModelFingerprintOf(model.file()));
  st.mutable_model()->set_description(ModelDescription(model));
  st.mutable_tokens()->Add(tokens_.begin(), tokens_.end());
  st.set_n_computed(n_cached_);
  if (options.kv) {
    // The K/V rows of tokens [0, n_cached) as the cache holds them, tile by tile (see KvData).
    KILN_RETURN_IF_ERROR(engine_.Locked([&](KvCache& cache, ForwardPass&) -> absl::Status {
      KILN_ASSIGN_OR_RETURN(const int32_t computed, cache.NumComputed(seq_));
      if (computed < n_cached_) {
        return absl::InternalError(kiln::StrCat("SaveState: the session counts ", n_cached_,
                                                " computed tokens, its sequence ", computed));
      }
      KILN_ASSIGN_OR_RETURN(const std::span<const BlockId> table, cache.BlockTable(seq_));
      const KvLayout& layout = cache.layout();
      state::KvData* kv = st.mutable_kv();
      kv->set_elem_type(static_cast<uint32_t>(layout.elem_type()));
      kv->set_row_elems(static_cast<uint32_t>(layout.row_elems()));
      const int32_t n_tiles = layout.n_layers() * layout.tiles_per_layer();
      const int32_t bs = layout.block_size();
      const size_t row = layout.row_bytes();
      for (int32_t t = 0; t < n_tiles; ++t) {
        std::string* tile = kv->add_tiles();
        tile->reserve(static_cast<size_t>(n_cached_) * row);  // appended, not zero-filled first
        const size_t tile_offset = static_cast<size_t>(t) * layout.tile_bytes();
        for (int32_t b = 0; b * bs < n_cached_; ++b) {
          const int32_t rows = std::min(bs, n_cached_ - b * bs);
          tile->append(reinterpret_cast<const char*>(cache.BlockData(table[b]) + tile_offset),
                       static_cast<size_t>(rows) * row);
        }
      }
      return absl::OkStatus();
    }));
    if (logits_valid_ && n_cached_ == n_tokens() && n_cached_ > 0) {
      st.mutable_logits()->Add(logits_.begin(), logits_.end());
    }
  }
  SamplerParamsToProto(sampler_.params(), st.mutable_sampler());
  for (uint64_t word : rng_.state()) st.add_rng_state(word);
  for (const sample::TokenLogprob& lp : last_logprobs_) {
    state::TokenLogprob* o = st.add_last_logprobs();
    o->set_token(lp.token);
    o->set_logprob(lp.logprob);
  }
  if (spec_ != nullptr) {
    state::SpeculativeState* sp = st.mutable_speculative();
    CostToProto(spec_->cost_model(), sp->mutable_cost());
    if (options.strategy && spec_->strategy() != nullptr) {
      auto saved = spec_->strategy()->SaveState();
      if (!saved.ok()) {
        return absl::Status(
            saved.status().code(),
            kiln::StrCat("SaveState: ", saved.status().message(),
                         "; save with SaveStateOptions::strategy = false (kiln_state_params."
                         "strategy = 0) to save the session without it"));
      }
      sp->set_strategy(std::string(spec_->strategy()->name()));
      sp->set_strategy_state(std::move(*saved));
    }
  }
  return state::Encode(st);
}

absl::Status Session::SaveStateToFile(const std::string& path, const SaveStateOptions& options) {
  KILN_ASSIGN_OR_RETURN(const std::string bytes, SaveState(options));
  const std::string tmp = path + ".tmp";
  absl::Status written = [&]() -> absl::Status {
    KILN_ASSIGN_OR_RETURN(platform::WritableFile file, platform::WritableFile::Create(tmp));
    KILN_RETURN_IF_ERROR(file.Write(bytes.data(), bytes.size()));
    return file.SyncAndClose();
  }();
  if (written.ok()) {
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      written = platform::StatusFromErrorCode(
          ec, kiln::StrCat("cannot rename '", tmp, "' to '", path, "'"));
    }
  }
  if (!written.ok()) std::remove(tmp.c_str());
  return written;
}

absl::Status Session::LoadStateFromFile(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(platform::ReadOnlyFile file, platform::ReadOnlyFile::Open(path));
  if (file.kind() != platform::ReadOnlyFile::Kind::kRegular) {
    return absl::InvalidArgumentError(kiln::StrCat("'", path, "' is not a regular file"));
  }
  if (file.size() > state::kMaxStateBytes) {
    return absl::DataLossError(kiln::StrCat("'", path, "' is not a kiln session state: ",
                                            file.size(), " bytes, more than a state can hold"));
  }
  KILN_ASSIGN_OR_RETURN(platform::FileMapping bytes, file.Map(file.size()));
  absl::Status st = LoadState(std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                               static_cast<size_t>(bytes.size())));
  if (!st.ok()) return absl::Status(st.code(), kiln::StrCat("'", path, "': ", st.message()));
  return st;
}

absl::Status Session::LoadState(std::string_view bytes) {
  Use use(*this, "LoadState", true);
  KILN_RETURN_IF_ERROR(use.status());
  const Model& model = engine_.model();
  state::StateTarget target;
  target.model_fingerprint = state::ModelFingerprintOf(model.file());
  target.model_description = ModelDescription(model);
  target.n_vocab = n_vocab_;
  target.n_ctx = engine_.n_ctx();
  engine_.Locked([&](KvCache& cache, ForwardPass&) {
    const KvLayout& layout = cache.layout();
    target.kv_type = layout.elem_type();
    target.kv_tiles = layout.n_layers() * layout.tiles_per_layer();
    target.kv_row_elems = layout.row_elems();
    target.kv_row_bytes = layout.row_bytes();
  });
  target.max_timed_width = spec::PassCostModel::kMaxTimedWidth;
  state::SessionState st;
  KILN_RETURN_IF_ERROR(state::Decode(bytes, target, &st));

  const sample::SamplerParams params = SamplerParamsFromProto(st.sampler());
  if (absl::Status valid = sample::Sampler::Validate(params); !valid.ok()) {
    return absl::InvalidArgumentError(
        kiln::StrCat("the session state's sampler parameters are invalid: ", valid.message()));
  }
  spec::Strategy* strategy = spec_strategy();
  const bool strategy_saved = st.has_speculative() && !st.speculative().strategy().empty();
  if (strategy != nullptr && strategy_saved) {
    if (strategy->name() != st.speculative().strategy()) {
      return absl::InvalidArgumentError(
          kiln::StrCat("the session state holds the state of a '", st.speculative().strategy(),
                       "' strategy; this session's strategy is '", strategy->name(),
                       "': set a strategy of the saved kind (or none) before LoadState"));
    }
    // A dry run on a clone, so that a state the strategy refuses changes nothing in the cache.
    if (auto clone = strategy->Clone(); clone.ok()) {
      KILN_RETURN_IF_ERROR((*clone)->LoadState(st.speculative().strategy_state()));
    }
  }

  // The restored sequence is built next to the current one and swapped in at the end, so that
  // any failure leaves the session as it was.
  const std::vector<int32_t> tokens(st.tokens().begin(), st.tokens().end());
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t n_computed = st.n_computed();
  std::vector<float> logits;
  bool logits_valid = false;
  int32_t attached = 0;
  int32_t computed = 0;
  auto free_seq = [&](SeqId seq) {
    engine_.Locked([&](KvCache& cache, ForwardPass&) { return cache.Free(seq); }).IgnoreError();
  };
  SeqId fresh = 0;
  if (st.has_kv()) {
    // Copy the saved rows into fresh blocks. AppendSlots checks the capacity before it changes
    // anything, and nothing after it can fail.
    const state::KvData& kv = st.kv();
    auto created = engine_.Locked([&](KvCache& cache, ForwardPass&) -> absl::StatusOr<SeqId> {
      const SeqId seq = cache.CreateSequence();
      absl::Status appended = cache.AppendSlots(seq, std::span(tokens).first(n_computed));
      if (!appended.ok()) {
        cache.Free(seq).IgnoreError();
        return absl::Status(appended.code(),
                            kiln::StrCat("LoadState: restoring the K/V of ", n_computed,
                                         " tokens: ", appended.message()));
      }
      KILN_ASSIGN_OR_RETURN(const std::span<const BlockId> table, cache.BlockTable(seq));
      const KvLayout& layout = cache.layout();
      const int32_t bs = layout.block_size();
      const size_t row = layout.row_bytes();
      for (int t = 0; t < kv.tiles_size(); ++t) {
        const std::string& tile = kv.tiles(t);
        const size_t tile_offset = static_cast<size_t>(t) * layout.tile_bytes();
        for (int32_t b = 0; b * bs < n_computed; ++b) {
          const int32_t rows = std::min(bs, n_computed - b * bs);
          std::memcpy(cache.BlockData(table[b]) + tile_offset,
                      tile.data() + static_cast<size_t>(b) * bs * row,
                      static_cast<size_t>(rows) * row);
        }
      }
      KILN_RETURN_IF_ERROR(cache.MarkComputed(seq, n_computed));
      return seq;
    });
    if (!created.ok()) return created.status();
    fresh = *created;
    if (st.logits_size() > 0) {
      logits.assign(st.logits().begin(), st.logits().end());
      logits_valid = true;
    }
  } else {
    // Tokens only: recompute the K/V of tokens [0, n_computed) (batch-invariant kernels give the
    // bits the saved session held), attaching cached prefix blocks where the cache has them.
    fresh = engine_.Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
    const bool need_logits = n_computed == n && n > 0;
    if (engine_.options().prefix_caching && n_computed > 0) {
      const int32_t attachable = need_logits ? n_computed - 1 : n_computed;
      auto hit = engine_.Locked([&](KvCache& cache, ForwardPass&) {
        return cache.AttachCachedPrefix(fresh, std::span(tokens).first(attachable));
      });
      if (!hit.ok()) {
        free_seq(fresh);
        return hit.status();
      }
      attached = *hit;
    }
    if (attached < n_computed) {
      PrefillRequest request;
      request.seq = fresh;
      request.tokens = std::span(tokens).subspan(attached, n_computed - attached);
      request.last_logits = need_logits;
      const int32_t last = n_computed - attached - 1;
      request.on_logits = [&](int32_t index, const float* row) {
        if (need_logits && index == last) {
          logits.assign(row, row + n_vocab_);
          logits_valid = true;
        }
      };
      request.cancelled = [this] { return ConsumeCancel(); };
      absl::Status prefilled = engine_.Prefill(request, &computed);
      stats_.computed_tokens += computed;
      if (!prefilled.ok()) {
        free_seq(fresh);
        return absl::Status(prefilled.code(),
                            kiln::StrCat("LoadState: recomputing the K/V of ", n_computed,
                                         " tokens: ", prefilled.message()));
      }
    }
  }

  // Commit: nothing below fails.
  if (strategy != nullptr) {
    if (strategy_saved) {
      absl::Status loaded = strategy->LoadState(st.speculative().strategy_state());
      if (!loaded.ok()) {  // only a strategy that cannot be cloned gets here (no dry run)
        free_seq(fresh);
        return loaded;
      }
    } else {
      strategy->Reset();
    }
  }
  free_seq(seq_);
  seq_ = fresh;
  tokens_ = tokens;
  n_cached_ = n_computed;
  stats_.attached_tokens += attached;
  logits_ = std::move(logits);
  logits_valid_ = logits_valid;
  sampler_ = sample::Sampler(params);
  rng_.SetState({st.rng_state(0), st.rng_state(1), st.rng_state(2), st.rng_state(3)});
  last_logprobs_.clear();
  for (const state::TokenLogprob& lp : st.last_logprobs()) {
    last_logprobs_.push_back({lp.token(), lp.logprob()});
  }
  if (spec_ != nullptr || st.has_speculative()) {
    // The decoder is bound to a sequence: a new one on the restored sequence.
    auto decoder =
        std::make_unique<spec::SpeculativeDecoder>(engine_, seq_, sampler_, rng_, strategy);
    if (st.has_speculative() && st.speculative().has_cost()) {
      decoder->cost_model().Restore(CostFromProto(st.speculative().cost()));
    } else if (spec_ != nullptr) {
      decoder->cost_model() = spec_->cost_model();
    }
    spec_ = std::move(decoder);
  }
  return absl::OkStatus();
}

absl::Status Session::Rewind(int32_t n) {
  Use use(*this, "Rewind", true);
  KILN_RETURN_IF_ERROR(use.status());
  if (n < 0 || n > n_tokens()) {
    return absl::OutOfRangeError(
        absl::StrCat("Rewind: ", n, " tokens requested, the session holds ", n_tokens()));
  }
  const int32_t new_len = n_tokens() - n;
  if (new_len < n_cached_) {
    KILN_RETURN_IF_ERROR(engine_.Locked(
        [&](KvCache& cache, ForwardPass&) { return cache.Truncate(seq_, new_len); }));
    n_cached_ = new_len;
    logits_valid_ = false;
  }
  tokens_.resize(new_len);
  return absl::OkStatus();
}

}  // namespace kiln
