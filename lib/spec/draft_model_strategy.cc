#include "lib/spec/draft_model_strategy.h"

#include <algorithm>
#include <chrono>

namespace kiln::spec {

DraftModelStrategy::~DraftModelStrategy() {
  if (engine_ == nullptr) return;
  engine_->Locked([&](KvCache& cache, ForwardPass&) { return cache.Free(seq_); }).IgnoreError();
}

absl::StatusOr<std::unique_ptr<DraftModelStrategy>> DraftModelStrategy::Load(
    const std::string& path, int64_t target_n_vocab, const DraftModelParams& params) {
  ModelLoadOptions load;
  load.path = path;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(load));
  std::shared_ptr<Model> shared(std::move(model));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<DraftModelStrategy> s,
                        Create(*shared, target_n_vocab, params));
  s->owned_model_ = std::move(shared);
  return s;
}

absl::StatusOr<std::shared_ptr<Engine>> DraftModelStrategy::MakeEngine(
    const Model& draft, const DraftModelParams& params) {
  EngineOptions options;
  options.prefix_caching = false;
  options.n_threads = params.n_threads;
  options.kv_type = params.kv_type;
  // The context, max_draft drafts, a copy-on-write spare and the null block.
  options.n_ctx = params.n_ctx + params.max_draft;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(draft, options));
  return std::shared_ptr<Engine>(std::move(engine));
}

absl::StatusOr<std::unique_ptr<DraftModelStrategy>> DraftModelStrategy::Create(
    const Model& draft, int64_t target_n_vocab, const DraftModelParams& params) {
  if (params.max_draft < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DraftModelParams.max_draft ", params.max_draft, " < 1"));
  }
  if (params.max_skip < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DraftModelParams.max_skip ", params.max_skip, " < 0"));
  }
  if (params.n_ctx < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DraftModelParams.n_ctx ", params.n_ctx, " < 0"));
  }
  if (!(params.draft_cost_prior > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DraftModelParams.draft_cost_prior ", params.draft_cost_prior, " <= 0"));
  }
  const ModelHparams& hp = draft.hparams();
  if (hp.n_vocab != target_n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("draft model vocabulary size ", hp.n_vocab,
                                                   " differs from the target's ", target_n_vocab));
  }
  std::unique_ptr<DraftModelStrategy> s(new DraftModelStrategy(draft, params));
  if (s->params_.n_ctx == 0) {
    s->params_.n_ctx =
        static_cast<int32_t>(hp.n_ctx_train > 0 ? std::min<int64_t>(hp.n_ctx_train, 8192) : 4096);
  }
  KILN_ASSIGN_OR_RETURN(s->engine_, MakeEngine(draft, s->params_));
  s->seq_ = s->engine_->Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
  s->Reset();
  return s;
}

absl::StatusOr<std::unique_ptr<Strategy>> DraftModelStrategy::Clone() const {
  std::unique_ptr<DraftModelStrategy> c(new DraftModelStrategy(*model_, params_));
  c->owned_model_ = owned_model_;
  c->engine_ = engine_;
  KILN_ASSIGN_OR_RETURN(
      c->seq_, engine_->Locked([&](KvCache& cache, ForwardPass&) { return cache.Fork(seq_); }));
  c->draft_len_ = draft_len_;
  c->acceptance_ = acceptance_;
  c->probes_ = probes_;
  c->skip_left_ = skip_left_;
  c->draft_t1_ = draft_t1_;
  c->last_context_len_ = last_context_len_;
  c->last_computed_drafts_ = last_computed_drafts_;
  return std::unique_ptr<Strategy>(std::move(c));
}

void DraftModelStrategy::Reset() {
  engine_->Locked([&](KvCache& cache, ForwardPass&) { return cache.Truncate(seq_, 0); })
      .IgnoreError();
  draft_len_ = 0;
  acceptance_.Reset();
  probes_ = 0;
  skip_left_ = 0;
  last_context_len_ = 0;
  last_computed_drafts_ = 0;
}

absl::Status DraftModelStrategy::Run(std::span<const int32_t> tokens) {
  const int64_t n_vocab = model_->hparams().n_vocab;
  PrefillRequest request;
  request.seq = seq_;
  request.tokens = tokens;
  request.on_logits = [&](int32_t, const float* row) { logits_.assign(row, row + n_vocab); };
  int32_t done = 0;
  absl::Status st = engine_->Prefill(request, &done);
  computed_tokens_ += done;
  return st;
}

absl::Status DraftModelStrategy::Sync(std::span<const int32_t> context) {
  KILN_ASSIGN_OR_RETURN(
      const size_t common,
      engine_->Locked([&](KvCache& cache, ForwardPass&) -> absl::StatusOr<size_t> {
        KILN_ASSIGN_OR_RETURN(std::span<const int32_t> held, cache.Tokens(seq_));
        size_t common = 0;
        const size_t limit = std::min(held.size(), context.size() - 1);  // recompute the last
        while (common < limit && held[common] == context[common]) ++common;
        KILN_RETURN_IF_ERROR(cache.Truncate(seq_, static_cast<int32_t>(common)));
        return common;
      }));
  const auto start = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(Run(context.subspan(common)));
  if (context.size() - common == 1) {
    ObserveDraftPass(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return absl::OkStatus();
}

void DraftModelStrategy::ObserveDraftPass(double seconds) {
  constexpr double kEmaWeight = 0.1;
  draft_t1_ = draft_t1_ == 0.0 ? seconds : draft_t1_ + kEmaWeight * (seconds - draft_t1_);
}

int32_t DraftModelStrategy::ChooseLength(int32_t max_k, const ProposeContext& ctx) {
  PassCostModel pinned;
  const PassCostModel* target = ctx.cost;
  const bool fixed = params_.fixed_pass_cost_beta >= 0.0;
  if (fixed || target == nullptr) {
    pinned.Pin(fixed ? params_.fixed_pass_cost_beta : PassCostModel::kPriorBeta);
    target = &pinned;
  }
  // One draft pass in one-token target passes.
  double draft_cost = params_.draft_cost_prior;
  if (!fixed && draft_t1_ > 0.0 && target->OneTokenSeconds() > 0.0) {
    draft_cost = draft_t1_ / target->OneTokenSeconds();
  }
  return BestDraftLength(acceptance_, max_k, [&](int32_t k) {
    return target->RelativeCost(k + 1) + draft_cost * static_cast<double>(k);
  });
}

absl::Status DraftModelStrategy::Propose(std::span<const int32_t> context, int32_t max_draft,
                                         const ProposeContext& ctx, DraftTree* out) {
  out->Clear();
  draft_len_ = 0;
  if (params_.adaptive && skip_left_ > 0) {
    --skip_left_;
    return absl::OkStatus();
  }
  const int32_t len = static_cast<int32_t>(context.size());
  const int32_t max_k = std::min({max_draft, params_.max_draft, params_.n_ctx - len});
  if (max_k <= 0 || len == 0) return absl::OkStatus();
  int32_t k = max_k;
  if (params_.adaptive) {
    k = ChooseLength(max_k, ctx);
    if (k == 0) {
      // Nothing pays: probe with one token, then skip 1, 2, 4 ... max_skip proposals.
      k = 1;
      ++probes_;
      skip_left_ = std::min(params_.max_skip, 1 << std::min(probes_ - 1, 20));
    } else {
      probes_ = 0;
    }
  }
  if (ctx.sampler_params == nullptr) {
    return absl::InvalidArgumentError("DraftModelStrategy::Propose: no sampler parameters");
  }
  if (ctx.sampler_params->temperature > 0.0f && ctx.rng == nullptr) {
    return absl::InvalidArgumentError("DraftModelStrategy::Propose: sampling needs an rng");
  }
  absl::Status st = Draft(context, k, ctx, out);
  if (absl::IsResourceExhausted(st) && shares_cache()) {
    // The engine shared with clones is full: move to an engine of our own and start over there.
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<Engine> own, MakeEngine(*model_, params_));
    engine_->Locked([&](KvCache& cache, ForwardPass&) { return cache.Free(seq_); }).IgnoreError();
    engine_ = std::move(own);
    seq_ = engine_->Locked([](KvCache& cache, ForwardPass&) { return cache.CreateSequence(); });
    st = Draft(context, k, ctx, out);
  }
  if (st.ok()) draft_len_ = out->size();
  return st;
}

absl::Status DraftModelStrategy::Draft(std::span<const int32_t> context, int32_t k,
                                       const ProposeContext& ctx, DraftTree* out) {
  out->Clear();
  const int32_t len = static_cast<int32_t>(context.size());
  const bool greedy = ctx.sampler_params->temperature <= 0.0f;
  KILN_RETURN_IF_ERROR(Sync(context));
  sample::Sampler sampler(*ctx.sampler_params);
  history_.assign(context.begin(), context.end());
  out->deterministic = greedy;
  sample::Distribution dist;
  using Clock = std::chrono::steady_clock;
  for (int32_t d = 0; d < k; ++d) {
    KILN_RETURN_IF_ERROR(sampler.Apply(logits_, history_, &dist));
    const int32_t token = greedy ? dist.Argmax() : sample::Sampler::Sample(dist, *ctx.rng);
    if (token < 0) return absl::InternalError("draft sampler returned no token");
    out->Add(token, d - 1);
    if (!greedy) out->q.push_back(dist);
    history_.push_back(token);
    if (d + 1 < k) {
      const int32_t one[1] = {token};
      const Clock::time_point start = Clock::now();
      KILN_RETURN_IF_ERROR(Run(one));
      ObserveDraftPass(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  last_context_len_ = len;
  last_computed_drafts_ = k - 1;
  return absl::OkStatus();
}

void DraftModelStrategy::Accepted(int32_t drafted, std::span<const int32_t> accepted) {
  if (drafted == 0) return;
  const int32_t m = static_cast<int32_t>(accepted.size());
  // Rollback: keep the context and the accepted drafts whose K/V the draft computed.
  engine_
      ->Locked([&](KvCache& cache, ForwardPass&) {
        return cache.Truncate(seq_, last_context_len_ + std::min(m, last_computed_drafts_));
      })
      .IgnoreError();
  acceptance_.Observe(drafted, m);
  if (m > 0) {  // a hit ends the back-off: evaluate again at the next proposal
    probes_ = 0;
    skip_left_ = 0;
  }
}

}  // namespace kiln::spec
