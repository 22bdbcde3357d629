#include "lib/session/session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>

#include "lib/common/platform.h"
#include "lib/engine/scheduler.h"
#include "lib/engine/speculative_decoder.h"
#include "lib/session/session_state.h"
#include "lib/tokenizer/streaming_detokenizer.h"
#include "lib/tokenizer/tokenizer.h"

namespace kiln {

// ------------------------------------------------------------------ Session::Job

// One request of the session in the engine's scheduler: compute the pending tokens (an append's
// prefill, in chunks), then, for a generation, sample and compute one token (or run one
// speculative step) per scheduler step until a stop. Plan, Finish, Fail and Preempt run on the
// stepping thread with the engine mutex held; the owner (the blocking call, or Poll) reads the
// result once finished() is true, and the events (the streamed text) under out_mu_.
class Session::Job final : public ScheduledTask {
 public:
  // One piece of streamed output, in order.
  struct Event {
    int32_t token = -1;  // -1: the text held back until the end
    std::string piece;
    bool stoppable = true;    // the callback's return value may stop generation here
    int32_t n_generated = 0;  // generated tokens up to and including this one
    size_t n_total = 0;       // session tokens after this one
    std::vector<sample::TokenLogprob> logprobs;  // only for a blocking callback that may read them
  };

  explicit Job(Session& session) : s_(session), detok_(session.engine_.model().tokenizer()) {}

  // A new request. Tokens past saved_tokens are rolled back when it ends before the session
  // holds prompt_end computed tokens (an append, a submitted prompt).
  void Reset(bool generate, GenerateOptions options, size_t saved_tokens, int32_t saved_cached,
             int32_t prompt_end, bool hold_each_step, bool async) {
    generate_ = generate;
    options_ = std::move(options);
    saved_tokens_ = saved_tokens;
    saved_cached_ = saved_cached;
    prompt_end_ = prompt_end;
    prompt_done_ = false;
    hold_each_step_ = hold_each_step;
    async_ = async;
    scores_ = {};
    score_from_ = 0;
    on_done_ = nullptr;
    detok_.Reset();
    held_text_.clear();
    result_ = GenerateResult{};
    status_ = absl::OkStatus();
    spec_planned_ = false;
    chunk_planned_ = 0;
    callback_stop_.store(false, std::memory_order_relaxed);
    done_reported_.store(false, std::memory_order_relaxed);
    submitted_ = true;
    {
      std::lock_guard<std::mutex> lock(out_mu_);
      events_.clear();
      poll_text_.clear();
      poll_tokens_.clear();
      out_done_ = false;
      out_status_ = absl::OkStatus();
      out_n_tokens_ = 0;
      out_reason_ = StopReason::kMaxTokens;
    }
    finished_.store(false, std::memory_order_release);
  }
  void SetScoring(std::span<float> scores, int32_t score_from) {
    scores_ = scores;
    score_from_ = score_from;
  }
  void SetOnDone(std::function<void(const absl::Status&, const GenerateResult&)> on_done) {
    on_done_ = std::move(on_done);
  }

  bool finished() const override { return finished_.load(std::memory_order_acquire); }
  bool decoding() const override { return s_.n_tokens() - s_.n_cached_ <= 1; }
  SeqId seq() const override { return s_.seq_; }
  std::span<const int32_t> AttachableTokens(const KvCache& cache) const override {
    // Plan's condition for AttachCachedPrefix.
    if (!s_.engine_.options().prefix_caching || s_.n_cached_ != 0 || !scores_.empty() ||
        s_.tokens_.empty()) {
      return {};
    }
    const absl::StatusOr<int32_t> len = cache.Length(s_.seq_);
    if (!len.ok() || *len != 0) return {};
    return std::span(s_.tokens_).first(s_.tokens_.size() - 1);
  }
  absl::StatusOr<int32_t> Plan(KvCache& cache, int32_t budget, ForwardBatch& batch) override;
  void Finish(KvCache& cache, ForwardPass& pass, const StepRows& rows) override;
  void Fail(KvCache& cache, const absl::Status& status, bool planned) override;
  void Preempt(KvCache& cache) override;
  void Deliver() override;

  // Owner side (the job is held or finished, so no step touches the session).
  std::deque<Event> TakeEvents() {
    std::lock_guard<std::mutex> lock(out_mu_);
    std::deque<Event> e;
    e.swap(events_);
    return e;
  }
  bool HasEvents() {
    std::lock_guard<std::mutex> lock(out_mu_);
    return !events_.empty();
  }
  // The owner's callback stopped generation after the token of an event.
  void StopByCallback(int32_t n_generated) {
    result_.n_tokens = n_generated;
    result_.reason = StopReason::kCallback;
    status_ = absl::OkStatus();
    MarkFinished();
  }
  void Poll(size_t text_capacity, size_t token_capacity, PollResult* out);

  bool submitted() const { return submitted_; }
  bool async() const { return async_; }
  bool hold_each_step() const { return hold_each_step_; }
  const GenerateOptions& options() const { return options_; }
  const absl::Status& status() const { return status_; }
  const GenerateResult& result() const { return result_; }

 private:
  // Samples the next token from the session's logits and handles it. Returns true when the job
  // goes on planning in this step (not ended, not held).
  bool SampleNext(KvCache& cache);
  // A generated token already in tokens_: end of generation, stop strings, streaming. Returns
  // true when the request ended.
  bool Handle(KvCache& cache, int32_t token, const std::vector<sample::TokenLogprob>& logprobs);
  // After the tokens of one step: max_tokens, then the hold of a blocking callback.
  void AfterTokens();
  void End(StopReason reason);
  void EndWithError(KvCache& cache, const absl::Status& status);
  void MarkFinished();
  void Push(Event event);

  Session& s_;
  bool generate_ = false;
  GenerateOptions options_;
  size_t saved_tokens_ = 0;
  int32_t saved_cached_ = 0;
  int32_t prompt_end_ = 0;
  bool prompt_done_ = false;
  bool hold_each_step_ = false;
  bool async_ = false;
  bool submitted_ = false;
  std::span<float> scores_;
  int32_t score_from_ = 0;
  std::function<void(const absl::Status&, const GenerateResult&)> on_done_;

  StreamingDetokenizer detok_;
  std::string held_text_;  // decoded text not emitted yet (it may start a stop string)
  GenerateResult result_;
  absl::Status status_;
  bool spec_planned_ = false;
  int32_t spec_max_emit_ = 0;
  spec::SpecStepResult spec_step_;
  int32_t chunk_planned_ = 0;
  std::atomic<bool> callback_stop_{false};
  std::atomic<bool> done_reported_{false};
  std::atomic<bool> finished_{false};

  std::mutex out_mu_;         // guards what follows
  std::deque<Event> events_;  // for the owner's callback (blocking) or Deliver (async)
  std::string poll_text_;     // for Poll (async without on_token)
  std::vector<int32_t> poll_tokens_;
  bool out_done_ = false;
  absl::Status out_status_;
  int32_t out_n_tokens_ = 0;
  StopReason out_reason_ = StopReason::kMaxTokens;
};

// ------------------------------------------------------------------ Session::Use

Session::Use::Use(const Session& session, const char* what, bool mutating)
    : session_(session), mutating_(mutating) {
  if (session.request_in_flight()) {
    // Checked first: a call refused here must not drop a cancel meant for the request.
    status_ = absl::AbortedError(absl::StrCat(
        what,
        ": the session is busy: a submitted request is in flight (poll it until done, or "
        "cancel it and poll)"));
    return;
  }
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
      rng_(seed),
      job_(std::make_unique<Job>(*this)) {}

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

void Session::Job::Push(Event event) {
  std::lock_guard<std::mutex> lock(out_mu_);
  out_n_tokens_ = event.n_generated;
  if (async_ && !options_.on_token) {
    // Polled: text and token ids are queued apart, each taken at its own pace.
    poll_text_ += event.piece;
    if (event.token >= 0) poll_tokens_.push_back(event.token);
    return;
  }
  events_.push_back(std::move(event));
}

void Session::Job::MarkFinished() {
  {
    std::lock_guard<std::mutex> lock(out_mu_);
    out_done_ = true;
    out_status_ = status_;
    out_n_tokens_ = result_.n_tokens;
    out_reason_ = result_.reason;
  }
  finished_.store(true, std::memory_order_release);
}

void Session::Job::End(StopReason reason) {
  if (generate_ && reason != StopReason::kStopString && reason != StopReason::kCallback) {
    held_text_ += detok_.Flush();
    if (!held_text_.empty()) {
      Push({-1,
            std::move(held_text_),
            /*stoppable=*/false,
            result_.n_tokens,
            s_.tokens_.size(),
            {}});
    }
    held_text_.clear();
  }
  result_.reason = reason;
  status_ = absl::OkStatus();
  MarkFinished();
}

void Session::Job::EndWithError(KvCache& cache, const absl::Status& status) {
  if (!prompt_done_) {
    s_.RestoreToLocked(cache, saved_tokens_, saved_cached_);
    s_.PublishNTokens(s_.tokens_.size());
  }
  status_ = status;
  MarkFinished();
}

bool Session::Job::Handle(KvCache& cache, int32_t token,
                          const std::vector<sample::TokenLogprob>& logprobs) {
  ++result_.n_tokens;
  const Tokenizer& tokenizer = s_.engine_.model().tokenizer();
  if (tokenizer.IsEndOfGeneration(token)) {
    End(StopReason::kEndOfGeneration);
    return true;
  }
  absl::StatusOr<std::string> piece = detok_.Push(token);
  if (!piece.ok()) {
    EndWithError(cache, piece.status());
    return true;
  }
  held_text_ += *piece;
  const bool keep_logprobs = hold_each_step_ && s_.sampler_.params().n_logprobs > 0;
  size_t stop_at = std::string::npos;
  for (const std::string& stop : options_.stop_strings) {
    stop_at = std::min(stop_at, held_text_.find(stop));
  }
  if (stop_at != std::string::npos) {
    Push({token, held_text_.substr(0, stop_at), /*stoppable=*/false, result_.n_tokens,
          s_.tokens_.size(), keep_logprobs ? logprobs : std::vector<sample::TokenLogprob>{}});
    held_text_.clear();
    End(StopReason::kStopString);
    return true;
  }
  // Hold back the longest suffix that could still grow into a stop string.
  size_t keep = 0;
  for (const std::string& stop : options_.stop_strings) {
    for (size_t len = std::min(stop.size() - 1, held_text_.size()); len > keep; --len) {
      if (held_text_.compare(held_text_.size() - len, len, stop, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  Push({token, held_text_.substr(0, held_text_.size() - keep), /*stoppable=*/true, result_.n_tokens,
        s_.tokens_.size(), keep_logprobs ? logprobs : std::vector<sample::TokenLogprob>{}});
  held_text_.erase(0, held_text_.size() - keep);
  return false;
}

void Session::Job::AfterTokens() {
  if (finished()) return;
  if (result_.n_tokens >= options_.max_tokens) {
    End(StopReason::kMaxTokens);
  } else if (hold_each_step_) {
    s_.engine_.scheduler().Hold(this);
  }
}

bool Session::Job::SampleNext(KvCache& cache) {
  Session& s = s_;
  if (s.n_tokens() >= s.engine_.n_ctx()) {
    if (result_.n_tokens == 0) {
      EndWithError(cache, absl::OutOfRangeError(absl::StrCat(
                              "Generate: the session already holds n_ctx = ", s.engine_.n_ctx(),
                              " tokens")));
    } else {
      End(StopReason::kContextFull);
    }
    return false;
  }
  absl::Status st = s.sampler_.Apply(s.logits_, s.tokens_, &s.dist_);
  if (!st.ok()) {
    EndWithError(cache, st);
    return false;
  }
  const int32_t token = sample::Sampler::Sample(s.dist_, s.rng_);
  if (token < 0) {
    EndWithError(cache, absl::InternalError("Generate: the sampler returned no token"));
    return false;
  }
  s.last_logprobs_ = s.dist_.top_logprobs;
  s.tokens_.push_back(token);  // pending: computed by the next step
  s.PublishNTokens(s.tokens_.size());
  if (Handle(cache, token, s.last_logprobs_)) return false;
  AfterTokens();
  return !finished() && !held();
}

absl::StatusOr<int32_t> Session::Job::Plan(KvCache& cache, int32_t budget, ForwardBatch& batch) {
  Session& s = s_;
  const Engine& engine = s.engine_;
  budget = std::max(1, budget);
  while (!finished() && !held()) {
    if (!prompt_done_ && s.n_cached_ >= prompt_end_) prompt_done_ = true;
    if (callback_stop_.load(std::memory_order_acquire)) {
      End(StopReason::kCallback);
      break;
    }
    if (generate_ && prompt_done_ && result_.n_tokens >= options_.max_tokens) {
      End(StopReason::kMaxTokens);
      break;
    }
    if (generate_ && prompt_done_ && s.n_cached_ == s.n_tokens() && !s.logits_valid_) {
      // After a Rewind, a prefix attach or a preemption: recompute the last token for its
      // logits.
      absl::Status st = cache.Truncate(s.seq_, s.n_cached_ - 1);
      if (!st.ok()) {
        EndWithError(cache, st);
        return st;
      }
      --s.n_cached_;
    }
    const int32_t n = s.n_tokens();
    if (s.ConsumeCancel()) {
      if (!prompt_done_) {
        EndWithError(cache, absl::CancelledError(absl::StrCat("cancelled after ", s.n_cached_,
                                                              " of ", n, " tokens were computed")));
      } else {
        End(StopReason::kCancelled);
      }
      break;
    }
    if (n == s.n_cached_) {
      if (!generate_) {
        End(StopReason::kMaxTokens);  // an append is done (the reason is unused)
        break;
      }
      if (!SampleNext(cache)) break;
      continue;
    }
    if (generate_ && prompt_done_ && s.spec_ != nullptr && s.spec_->strategy() != nullptr &&
        s.n_cached_ + 1 == n && n < engine.n_ctx() && !s.sample_after_recompute_) {
      // A speculative step: the pending token is the root of a draft tree.
      spec_max_emit_ = std::min(options_.max_tokens - result_.n_tokens, engine.n_ctx() - n);
      absl::StatusOr<int32_t> added =
          s.spec_->Plan(s.tokens_, spec_max_emit_, budget, cache, &batch);
      if (!added.ok()) {
        if (!absl::IsResourceExhausted(added.status())) EndWithError(cache, added.status());
        return added.status();
      }
      spec_planned_ = true;
      return *added;
    }
    absl::StatusOr<int32_t> len = cache.Length(s.seq_);
    if (!len.ok()) {
      EndWithError(cache, len.status());
      return len.status();
    }
    if (engine.options().prefix_caching && s.n_cached_ == 0 && *len == 0 && scores_.empty()) {
      // Attach the longest cached prefix of tokens[0, n - 1): the last token is always computed
      // so that its logits exist.
      absl::StatusOr<int32_t> attached =
          cache.AttachCachedPrefix(s.seq_, std::span(s.tokens_).first(n - 1));
      if (!attached.ok()) {
        EndWithError(cache, attached.status());
        return attached.status();
      }
      if (*attached > 0) s.logits_valid_ = false;
      s.n_cached_ += *attached;
      s.stats_.attached_tokens += *attached;
      *len = s.n_cached_;
    }
    if (*len != s.n_cached_) {
      absl::Status st = absl::InternalError(absl::StrCat(
          "session: the cache holds ", *len, " tokens but ", s.n_cached_, " are computed"));
      EndWithError(cache, st);
      return st;
    }
    const int32_t start = s.n_cached_;
    // A speculating session recomputing its tokens (after a preemption) leaves the last one
    // pending: it is the root of the next speculative step, as it would have been unpreempted
    // (a plain sample from its logits would draw from the random stream differently), unless
    // it was preempted where it was to sample from them.
    const bool speculating = generate_ && prompt_done_ && s.spec_ != nullptr &&
                             s.spec_->strategy() != nullptr && n < engine.n_ctx() &&
                             !s.sample_after_recompute_;
    const int32_t end = speculating ? n - 1 : n;
    const int32_t chunk = std::min({end - start, engine.options().prefill_chunk, budget});
    absl::Status st = cache.AppendSlots(s.seq_, std::span(s.tokens_).subspan(start, chunk));
    if (!st.ok()) {
      if (!absl::IsResourceExhausted(st)) EndWithError(cache, st);
      return st;
    }
    for (int32_t i = start; i < start + chunk; ++i) {
      const bool want = (!scores_.empty() && i >= score_from_) || i == n - 1;
      batch.Add(s.tokens_[i], s.seq_, i, want);
    }
    chunk_planned_ = chunk;
    return chunk;
  }
  return 0;
}

void Session::Job::Finish(KvCache& cache, ForwardPass& pass, const StepRows& rows) {
  Session& s = s_;
  if (spec_planned_) {
    spec_planned_ = false;
    absl::Status st = s.spec_->Finish(&s.tokens_, spec_max_emit_, cache, pass.backend(), *rows.out,
                                      rows.row_begin, rows.forward_seconds, &spec_step_);
    if (!st.ok()) {
      EndWithError(cache, st);
      return;
    }
    const int32_t n = s.n_tokens();
    s.n_cached_ = n - 1;
    s.logits_valid_ = false;
    s.stats_.computed_tokens += 1 + spec_step_.drafted;
    const int32_t first = n - static_cast<int32_t>(spec_step_.emitted.size());
    bool stop = false;
    for (int32_t i = first; i < n && !stop; ++i) {
      if (!spec_step_.logprobs.empty()) s.last_logprobs_ = spec_step_.logprobs[i - first];
      s.PublishNTokens(static_cast<size_t>(i + 1));
      stop = Handle(cache, s.tokens_[i], s.last_logprobs_);
      if (stop && i + 1 < n) {
        // Drop the tokens after the stopping one (their K/V too); the stopping token stays
        // computed, its logits are recomputed by the next Generate.
        s.RestoreToLocked(cache, static_cast<size_t>(i + 1), std::min(s.n_cached_, i + 1));
        s.PublishNTokens(static_cast<size_t>(i + 1));
      }
    }
    if (!stop) AfterTokens();
    return;
  }
  const int32_t chunk = chunk_planned_;
  chunk_planned_ = 0;
  const int32_t base = s.n_cached_;
  const int32_t n = s.n_tokens();
  const ForwardOutput& out = *rows.out;
  for (size_t r = rows.row_begin;
       r < out.logit_tokens.size() && out.logit_tokens[r] < rows.batch_end; ++r) {
    const int32_t i = base + (out.logit_tokens[r] - rows.batch_begin);
    const float* row = out.LogitsRow(r);
    if (!scores_.empty() && i >= score_from_ && i + 1 < n) {
      double max_logit = row[0];
      for (int64_t v = 1; v < s.n_vocab_; ++v) max_logit = std::max<double>(max_logit, row[v]);
      double sum = 0;
      for (int64_t v = 0; v < s.n_vocab_; ++v) sum += std::exp(row[v] - max_logit);
      scores_[i - score_from_] =
          static_cast<float>(row[s.tokens_[i + 1]] - max_logit - std::log(sum));
    }
    if (i == n - 1) {
      s.logits_.assign(row, row + s.n_vocab_);
      s.logits_valid_ = true;
      s.sample_after_recompute_ = false;
    }
  }
  s.n_cached_ += chunk;
  s.stats_.computed_tokens += chunk;
  if (s.n_cached_ < n) return;  // more chunks to come
  if (!prompt_done_ && s.n_cached_ >= prompt_end_) prompt_done_ = true;
  if (!generate_) {
    End(StopReason::kMaxTokens);  // an append is done
  } else if (result_.n_tokens >= options_.max_tokens) {
    End(StopReason::kMaxTokens);
  } else {
    SampleNext(cache);
  }
}

void Session::Job::Fail(KvCache& cache, const absl::Status& status, bool planned) {
  if (planned) {
    if (spec_planned_) {
      s_.spec_->Undo(cache);
    } else {
      cache.Truncate(s_.seq_, s_.n_cached_).IgnoreError();
    }
    spec_planned_ = false;
    chunk_planned_ = 0;
  }
  EndWithError(cache, status);
}

void Session::Job::Preempt(KvCache& cache) {
  if (s_.logits_valid_ && s_.n_cached_ == s_.n_tokens()) s_.sample_after_recompute_ = true;
  cache.Truncate(s_.seq_, 0).IgnoreError();
  s_.n_cached_ = 0;
  s_.logits_valid_ = false;
  ++s_.stats_.preemptions;
}

void Session::Job::Deliver() {
  if (!async_) return;
  if (options_.on_token) {
    for (Event& e : TakeEvents()) {
      if (e.token < 0 && e.piece.empty()) continue;
      if (!options_.on_token(e.token, e.piece) && e.stoppable && !finished()) {
        callback_stop_.store(true, std::memory_order_release);
      }
    }
  }
  if ((options_.on_token || on_done_) && finished() &&
      !done_reported_.exchange(true, std::memory_order_acq_rel)) {
    // The session takes calls again from here on (on_done may submit the next request, which
    // resets this job), so nothing of the job is touched after on_done.
    auto on_done = std::move(on_done_);
    on_done_ = nullptr;
    const absl::Status status = status_;
    const GenerateResult result = result_;
    s_.in_flight_.store(false, std::memory_order_release);
    if (on_done) on_done(status, result);
  }
}

void Session::Job::Poll(size_t text_capacity, size_t token_capacity, PollResult* out) {
  std::lock_guard<std::mutex> lock(out_mu_);
  // A capacity of 0 means the caller does not want that kind of output: it is dropped.
  const size_t n_text =
      text_capacity == 0 ? poll_text_.size() : std::min(text_capacity, poll_text_.size());
  if (text_capacity > 0) out->text.assign(poll_text_, 0, n_text);
  poll_text_.erase(0, n_text);
  const size_t n_tokens =
      token_capacity == 0 ? poll_tokens_.size() : std::min(token_capacity, poll_tokens_.size());
  if (token_capacity > 0) {
    out->tokens.assign(poll_tokens_.begin(),
                       poll_tokens_.begin() + static_cast<std::ptrdiff_t>(n_tokens));
  }
  poll_tokens_.erase(poll_tokens_.begin(),
                     poll_tokens_.begin() + static_cast<std::ptrdiff_t>(n_tokens));
  out->text_left = poll_text_.size();
  out->tokens_left = poll_tokens_.size();
  out->n_tokens = out_n_tokens_;
  out->done = out_done_ && poll_text_.empty() && poll_tokens_.empty();
  if (out->done) {
    out->status = out_status_;
    out->reason = out_reason_;
  }
}

// ------------------------------------------------------------------ Session

Session::~Session() {
  if (job_->submitted() && job_->async()) {  // a blocking call's job is out already
    cancel_.store(true, std::memory_order_release);
    engine_.scheduler().Remove(job_.get());
  }
  engine_.Locked([&](KvCache& cache, ForwardPass&) { return cache.Free(seq_); }).IgnoreError();
}

void Session::Cancel() {
  cancel_.store(true, std::memory_order_release);
  engine_.scheduler().Wake();
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

void Session::RestoreToLocked(KvCache& cache, size_t n_tokens, int32_t n_cached) {
  auto len = cache.Length(seq_);
  if (len.ok() && *len > n_cached) cache.Truncate(seq_, n_cached).IgnoreError();
  // A preempted sequence holds fewer computed tokens than it did.
  if (len.ok()) n_cached = std::min(n_cached, *len);
  if (n_cached < n_cached_) logits_valid_ = false;
  tokens_.resize(n_tokens);
  n_cached_ = n_cached;
}

void Session::RestoreTo(size_t n_tokens, int32_t n_cached) {
  engine_.Locked([&](KvCache& cache, ForwardPass&) {
    RestoreToLocked(cache, n_tokens, n_cached);
    return 0;
  });
}

namespace {

absl::Status CheckGenerateOptions(const GenerateOptions& options) {
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
  return absl::OkStatus();
}

absl::Status NotFromStepCallback(const char* what) {
  if (!Scheduler::InStep()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      what,
      ": called from a callback of the engine's step (a blocking call there would wait "
      "for itself); submit a request instead"));
}

}  // namespace

Session::Job& Session::PrepareJob() {
  // A submitted request ends in a step that may not have dropped it from the scheduler yet.
  if (job_->submitted() && job_->async()) engine_.scheduler().Remove(job_.get());
  return *job_;
}

absl::Status Session::RunJob() {
  Scheduler& scheduler = engine_.scheduler();
  Job& job = *job_;
  scheduler.Submit(&job);
  const bool deliver = job.hold_each_step();
  while (true) {
    absl::Status st = scheduler.RunUntil([&] { return job.finished() || job.held(); });
    if (!st.ok()) {
      cancel_.store(true, std::memory_order_release);
      scheduler.Remove(&job);
      return st;
    }
    if (deliver) {
      // The job is held or finished: no step touches the session until it is released.
      const std::vector<sample::TokenLogprob> latest = last_logprobs_;
      const bool want_logprobs = sampler_.params().n_logprobs > 0;
      bool stopped = false;
      for (Job::Event& e : job.TakeEvents()) {
        if (e.token >= 0 && want_logprobs) last_logprobs_ = e.logprobs;
        if (job.options().on_token(e.token, e.piece) || !e.stoppable) continue;
        // The callback stopped generation after this token: the tokens after it go.
        if (tokens_.size() > e.n_total) {
          RestoreTo(e.n_total, std::min<int32_t>(n_cached_, static_cast<int32_t>(e.n_total)));
          PublishNTokens(tokens_.size());
        }
        job.StopByCallback(e.n_generated);
        stopped = true;
        break;
      }
      if (!stopped) last_logprobs_ = latest;
    }
    if (job.finished()) break;
    scheduler.Release(&job);
  }
  scheduler.Remove(&job);
  return job.status();
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
  KILN_RETURN_IF_ERROR(NotFromStepCallback("AppendTokens"));
  PrepareJob();
  const size_t saved_tokens = tokens_.size();
  const int32_t saved_cached = n_cached_;
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  job_->Reset(/*generate=*/false, {}, saved_tokens, saved_cached, n_tokens(),
              /*hold_each_step=*/false, /*async=*/false);
  return RunJob();
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
  KILN_RETURN_IF_ERROR(NotFromStepCallback("AppendTokensScored"));
  PrepareJob();
  const size_t saved_tokens = tokens_.size();
  const int32_t saved_cached = n_cached_;
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  job_->Reset(/*generate=*/false, {}, saved_tokens, saved_cached, n_tokens(),
              /*hold_each_step=*/false, /*async=*/false);
  job_->SetScoring(logprobs, static_cast<int32_t>(saved_tokens));
  return RunJob();
}

absl::StatusOr<GenerateResult> Session::Generate(const GenerateOptions& options) {
  Use use(*this, "Generate", true);
  KILN_RETURN_IF_ERROR(use.status());
  KILN_RETURN_IF_ERROR(CheckGenerateOptions(options));
  if (tokens_.empty()) {
    return absl::FailedPreconditionError("Generate: the session is empty; append a prompt first");
  }
  KILN_RETURN_IF_ERROR(NotFromStepCallback("Generate"));
  PrepareJob();
  // A callback sees each step's tokens before the next step runs (it may stop generation or
  // read the session), so the job waits for this thread after every step that made tokens.
  const bool hold = static_cast<bool>(options.on_token);
  job_->Reset(/*generate=*/true, options, tokens_.size(), n_cached_, /*prompt_end=*/0, hold,
              /*async=*/false);
  KILN_RETURN_IF_ERROR(RunJob());
  return job_->result();
}

absl::Status Session::Submit(SubmitOptions options) {
  {
    Use use(*this, "Submit", true);
    KILN_RETURN_IF_ERROR(use.status());
    KILN_RETURN_IF_ERROR(CheckGenerateOptions(options.generate));
    KILN_RETURN_IF_ERROR(CheckTokens(options.prompt));
    if (tokens_.size() + options.prompt.size() > static_cast<size_t>(engine_.n_ctx())) {
      return absl::OutOfRangeError(
          absl::StrCat("appending ", options.prompt.size(), " tokens to ", tokens_.size(),
                       " would pass the context size n_ctx = ", engine_.n_ctx()));
    }
    if (tokens_.empty() && options.prompt.empty()) {
      return absl::FailedPreconditionError(
          "Submit: the session is empty and the request has no prompt");
    }
    PrepareJob();
    const size_t saved_tokens = tokens_.size();
    const int32_t saved_cached = n_cached_;
    tokens_.insert(tokens_.end(), options.prompt.begin(), options.prompt.end());
    job_->Reset(/*generate=*/true, std::move(options.generate), saved_tokens, saved_cached,
                options.prompt.empty() ? 0 : n_tokens(), /*hold_each_step=*/false,
                /*async=*/true);
    job_->SetOnDone(std::move(options.on_done));
    in_flight_.store(true, std::memory_order_release);
  }
  engine_.scheduler().Submit(job_.get());
  return absl::OkStatus();
}

absl::Status Session::Poll(size_t text_capacity, size_t token_capacity, PollResult* out) {
  *out = PollResult{};
  if (!job_->submitted() || !job_->async()) {
    return absl::FailedPreconditionError("Poll: no request was submitted on this session");
  }
  job_->Poll(text_capacity, token_capacity, out);
  if (out->done) in_flight_.store(false, std::memory_order_release);
  return absl::OkStatus();
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
  fork->sample_after_recompute_ = sample_after_recompute_;
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

// Start of tile t (KvData's order: per layer, K of each KV head then V, or the MLA latent) in
// block b of the tile's layer's group.
std::byte* TileData(KvCache& cache, BlockId b, int32_t t) {
  const KvLayout& layout = cache.layout();
  const int32_t layer = t / layout.tiles_per_layer();
  const int32_t j = t % layout.tiles_per_layer();
  if (layout.kind() == KvAttentionKind::kMla) return cache.LatentPtr(b, layer);
  const int32_t heads = layout.n_kv_heads();
  return j < heads ? cache.KeyPtr(b, layer, j) : cache.ValuePtr(b, layer, j - heads);
}

// Each tile's first saved row: KvData.sliding_first_row for the model's sliding layers, else 0.
int32_t SavedFirstRow(const ModelHparams& hp, const KvLayout& layout, int32_t t,
                      uint32_t sliding_first_row) {
  return hp.is_swa(t / layout.tiles_per_layer()) ? static_cast<int32_t>(sliding_first_row) : 0;
}

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
  st.set_sample_after_recompute(sample_after_recompute_);
  st.set_last_logits_dropped(n_cached_ == n_tokens() && n_cached_ > 0 && !logits_valid_);
  if (options.kv) {
    // The K/V rows of tokens [0, n_cached) as the cache holds them, tile by tile (see KvData);
    // the sliding layers' from their first row not released.
    KILN_RETURN_IF_ERROR(engine_.Locked([&](KvCache& cache, ForwardPass&) -> absl::Status {
      if (!cache.host_addressable()) {
        return absl::UnimplementedError(
            "SaveState: the K/V are in device memory (CUDA backend), which saving does not read "
            "yet; save without the K/V");
      }
      KILN_ASSIGN_OR_RETURN(const int32_t computed, cache.NumComputed(seq_));
      if (computed < n_cached_) {
        return absl::InternalError(kiln::StrCat("SaveState: the session counts ", n_cached_,
                                                " computed tokens, its sequence ", computed));
      }
      KILN_ASSIGN_OR_RETURN(const int32_t released, cache.SlidingBlocksReleased(seq_));
      const KvLayout& layout = cache.layout();
      const int32_t bs = layout.block_size();
      state::KvData* kv = st.mutable_kv();
      kv->set_elem_type(static_cast<uint32_t>(layout.elem_type()));
      kv->set_row_elems(static_cast<uint32_t>(layout.row_elems()));
      kv->set_sliding_first_row(
          static_cast<uint32_t>(std::min<int64_t>(n_cached_, static_cast<int64_t>(released) * bs)));
      const int32_t n_tiles = layout.n_layers() * layout.tiles_per_layer();
      const size_t row = layout.row_bytes();
      for (int32_t t = 0; t < n_tiles; ++t) {
        KILN_ASSIGN_OR_RETURN(
            const std::span<const BlockId> blocks,
            cache.BlockTable(seq_, layout.layer_group(t / layout.tiles_per_layer())));
        const int32_t first = SavedFirstRow(model.hparams(), layout, t, kv->sliding_first_row());
        std::string* tile = kv->add_tiles();
        tile->reserve(static_cast<size_t>(n_cached_ - first) * row);  // appended, not zeroed
        for (int32_t r = first; r < n_cached_;) {
          const int32_t rows = std::min(bs - r % bs, n_cached_ - r);
          tile->append(reinterpret_cast<const char*>(TileData(cache, blocks[r / bs], t) +
                                                     static_cast<size_t>(r % bs) * row),
                       static_cast<size_t>(rows) * row);
          r += rows;
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
  if (model.hparams().sliding_window > 0) target.kv_sliding_layers = model.hparams().swa_layers;
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
  // Saved K/V are copied in when they hold every row the cache keeps (a cache that releases
  // sliding-window blocks keeps fewer); otherwise they are recomputed from the tokens, which
  // gives the same bits.
  const int32_t keep_from = engine_.Locked([&](KvCache& cache, ForwardPass&) {
    return cache.ReleasableSlidingBlocks(n_computed) * cache.block_size();
  });
  if (st.has_kv() && static_cast<int64_t>(st.kv().sliding_first_row()) <= keep_from) {
    // Copy the saved rows into fresh blocks. AppendSlotsForRestore checks the capacity before it
    // changes anything, and nothing after it can fail.
    const state::KvData& kv = st.kv();
    auto created = engine_.Locked([&](KvCache& cache, ForwardPass&) -> absl::StatusOr<SeqId> {
      if (!cache.host_addressable()) {
        return absl::UnimplementedError(
            "LoadState: the K/V are in device memory (CUDA backend), which restoring does not "
            "write yet; save the state without the K/V");
      }
      const SeqId seq = cache.CreateSequence();
      const std::span<const int32_t> computed_tokens = std::span(tokens).first(n_computed);
      absl::Status appended = cache.AppendSlotsForRestore(seq, computed_tokens, n_computed);
      if (!appended.ok()) {
        cache.Free(seq).IgnoreError();
        return absl::Status(appended.code(),
                            kiln::StrCat("LoadState: restoring the K/V of ", n_computed,
                                         " tokens: ", appended.message()));
      }
      const KvLayout& layout = cache.layout();
      const int32_t bs = layout.block_size();
      const size_t row = layout.row_bytes();
      for (int32_t t = 0; t < kv.tiles_size(); ++t) {
        const int32_t group = layout.layer_group(t / layout.tiles_per_layer());
        KILN_ASSIGN_OR_RETURN(const std::span<const BlockId> blocks, cache.BlockTable(seq, group));
        const int32_t saved_first =
            SavedFirstRow(model.hparams(), layout, t, kv.sliding_first_row());
        const char* src = kv.tiles(t).data();
        for (int32_t r = layout.group_is_sliding(group) ? keep_from : 0; r < n_computed;) {
          const int32_t rows = std::min(bs - r % bs, n_computed - r);
          std::memcpy(TileData(cache, blocks[r / bs], t) + static_cast<size_t>(r % bs) * row,
                      src + static_cast<size_t>(r - saved_first) * row,
                      static_cast<size_t>(rows) * row);
          r += rows;
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
    const bool need_logits = n_computed == n && n > 0 && !st.last_logits_dropped();
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
  sample_after_recompute_ = st.sample_after_recompute() && !logits_valid;
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
    KILN_RETURN_IF_ERROR(engine_.Locked([&](KvCache& cache, ForwardPass&) -> absl::Status {
      absl::Status st = cache.Truncate(seq_, new_len);
      if (!absl::IsFailedPrecondition(st)) return st;
      // The window of new_len was released (EngineOptions::swa_full false): the next
      // generate recomputes the kept tokens, attaching what the prefix cache still holds.
      n_cached_ = 0;
      return cache.Truncate(seq_, 0);
    }));
    n_cached_ = std::min(n_cached_, new_len);
    logits_valid_ = false;
  }
  // The last token is another one: its logits are recomputed, as after any rewind.
  if (n > 0) sample_after_recompute_ = false;
  tokens_.resize(new_len);
  return absl::OkStatus();
}

}  // namespace kiln
