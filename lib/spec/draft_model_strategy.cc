#include "lib/spec/draft_model_strategy.h"

#include <algorithm>

namespace kiln::spec {

DraftModelStrategy::~DraftModelStrategy() = default;

absl::StatusOr<std::unique_ptr<DraftModelStrategy>> DraftModelStrategy::Load(
    const std::string& path, int64_t target_n_vocab, const DraftModelParams& params) {
  ModelLoadOptions load;
  load.path = path;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(load));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<DraftModelStrategy> s,
                        Create(*model, target_n_vocab, params));
  s->owned_model_ = std::move(model);
  return s;
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
  constexpr int32_t kBlockSize = 16;
  KILN_ASSIGN_OR_RETURN(KvLayout layout, LlamaForward::CacheLayout(hp, params.kv_type, kBlockSize));
  KvCacheOptions options;
  options.enable_prefix_caching = false;
  // The context, max_draft drafts, a copy-on-write spare and the null block.
  const size_t blocks =
      static_cast<size_t>((s->params_.n_ctx + params.max_draft + kBlockSize - 1) / kBlockSize) + 2;
  options.capacity_bytes = blocks * layout.block_bytes();
  KILN_ASSIGN_OR_RETURN(s->cache_, KvCache::Create(layout, options));
  s->forward_ = std::make_unique<LlamaForward>(draft, params.n_threads);
  s->seq_ = s->cache_->CreateSequence();
  return s;
}

void DraftModelStrategy::Reset() {
  cache_->Truncate(seq_, 0).IgnoreError();
  draft_len_ = params_.max_draft;
  misses_ = 0;
  skip_left_ = 0;
  last_context_len_ = 0;
  last_computed_drafts_ = 0;
}

absl::Status DraftModelStrategy::Run(std::span<const int32_t> tokens, int32_t pos) {
  constexpr int32_t kChunk = 256;
  const int64_t n_vocab = model_->hparams().n_vocab;
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const size_t end = std::min(tokens.size(), begin + kChunk);
    batch_.Clear();
    for (size_t i = begin; i < end; ++i) {
      batch_.Add(tokens[i], seq_, pos + static_cast<int32_t>(i), i + 1 == tokens.size());
    }
    const auto chunk = tokens.subspan(begin, end - begin);
    KILN_RETURN_IF_ERROR(cache_->AppendSlots(seq_, chunk));
    absl::Status st = forward_->Forward(batch_, *cache_, &out_);
    if (!st.ok()) {
      cache_->Truncate(seq_, pos + static_cast<int32_t>(begin)).IgnoreError();
      return st;
    }
  }
  if (out_.logit_tokens.size() != 1) {
    return absl::InternalError("draft forward: expected one logits row");
  }
  logits_.assign(out_.LogitsRow(0), out_.LogitsRow(0) + n_vocab);
  return absl::OkStatus();
}

absl::Status DraftModelStrategy::Sync(std::span<const int32_t> context) {
  KILN_ASSIGN_OR_RETURN(std::span<const int32_t> held, cache_->Tokens(seq_));
  size_t common = 0;
  const size_t limit = std::min(held.size(), context.size() - 1);  // recompute the last token
  while (common < limit && held[common] == context[common]) ++common;
  KILN_RETURN_IF_ERROR(cache_->Truncate(seq_, static_cast<int32_t>(common)));
  return Run(context.subspan(common), static_cast<int32_t>(common));
}

absl::Status DraftModelStrategy::Propose(std::span<const int32_t> context, int32_t max_draft,
                                         const ProposeContext& ctx, DraftTree* out) {
  out->Clear();
  if (params_.adaptive && skip_left_ > 0) {
    --skip_left_;
    return absl::OkStatus();
  }
  const int32_t len = static_cast<int32_t>(context.size());
  int32_t k =
      std::min({max_draft, params_.adaptive ? draft_len_ : params_.max_draft, params_.n_ctx - len});
  if (k <= 0 || len == 0) return absl::OkStatus();
  if (ctx.sampler_params == nullptr) {
    return absl::InvalidArgumentError("DraftModelStrategy::Propose: no sampler parameters");
  }
  const bool greedy = ctx.sampler_params->temperature <= 0.0f;
  if (!greedy && ctx.rng == nullptr) {
    return absl::InvalidArgumentError("DraftModelStrategy::Propose: sampling needs an rng");
  }
  KILN_RETURN_IF_ERROR(Sync(context));
  sample::Sampler sampler(*ctx.sampler_params);
  history_.assign(context.begin(), context.end());
  out->deterministic = greedy;
  sample::Distribution dist;
  for (int32_t d = 0; d < k; ++d) {
    KILN_RETURN_IF_ERROR(sampler.Apply(logits_, history_, &dist));
    const int32_t token = greedy ? dist.Argmax() : sample::Sampler::Sample(dist, *ctx.rng);
    if (token < 0) return absl::InternalError("draft sampler returned no token");
    out->Add(token, d - 1);
    if (!greedy) out->q.push_back(dist);
    history_.push_back(token);
    if (d + 1 < k) {
      const int32_t one[1] = {token};
      KILN_RETURN_IF_ERROR(Run(one, len + d));
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
  cache_->Truncate(seq_, last_context_len_ + std::min(m, last_computed_drafts_)).IgnoreError();
  if (!params_.adaptive) return;
  if (m == 0 && draft_len_ == 1) {
    ++misses_;
    skip_left_ = std::min(params_.max_skip, 1 << std::min(misses_ - 1, 20));
  } else if (m > 0) {
    misses_ = 0;
  }
  if (m == drafted) {
    draft_len_ = std::min(params_.max_draft, draft_len_ + 1);
  } else {
    draft_len_ = std::max(1, draft_len_ - 1);
  }
}

}  // namespace kiln::spec
