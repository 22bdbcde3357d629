#include "lib/spec/ngram_strategy.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "lib/common/status.h"
#include "lib/session/session_state.pb.h"

namespace kiln::spec {

absl::StatusOr<std::unique_ptr<NgramStrategy>> NgramStrategy::Create(const NgramParams& params) {
  if (params.min_ngram < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NgramParams.min_ngram ", params.min_ngram, " < 1"));
  }
  if (params.max_ngram < params.min_ngram) {
    return absl::InvalidArgumentError(absl::StrCat("NgramParams.max_ngram ", params.max_ngram,
                                                   " < min_ngram ", params.min_ngram));
  }
  if (params.max_ngram > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("NgramParams.max_ngram ", params.max_ngram, " > 64"));
  }
  if (params.max_draft < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("NgramParams.max_draft ", params.max_draft, " < 1"));
  }
  if (params.start_draft < 1 || params.start_draft > params.max_draft) {
    return absl::InvalidArgumentError(absl::StrCat("NgramParams.start_draft ", params.start_draft,
                                                   " is outside [1, max_draft = ", params.max_draft,
                                                   "]"));
  }
  if (params.max_skip < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NgramParams.max_skip ", params.max_skip, " < 0"));
  }
  return std::unique_ptr<NgramStrategy>(new NgramStrategy(params));
}

void NgramStrategy::Reset() {
  acceptance_.assign(static_cast<size_t>(params_.max_ngram) + 1, AcceptanceEstimate());
  pending_.clear();
  pending_len_ = 0;
  pending_root_ = -1;
  pending_n_ = 0;
  plain_run_ = 0;
}

absl::StatusOr<std::unique_ptr<Strategy>> NgramStrategy::Clone() const {
  return std::unique_ptr<Strategy>(new NgramStrategy(*this));
}

absl::StatusOr<std::string> NgramStrategy::SaveState() const {
  state::NgramStrategyState st;
  st.set_max_ngram(params_.max_ngram);
  st.set_min_ngram(params_.min_ngram);
  st.set_max_draft(params_.max_draft);
  st.set_start_draft(params_.start_draft);
  st.set_max_skip(params_.max_skip);
  st.set_adaptive(params_.adaptive);
  st.set_fixed_pass_cost_beta(params_.fixed_pass_cost_beta);
  for (const AcceptanceEstimate& a : acceptance_) {
    const std::array<double, 4> c = a.counts();
    state::AcceptanceState* out = st.add_acceptance();
    out->set_s1(c[0]);
    out->set_f1(c[1]);
    out->set_s(c[2]);
    out->set_f(c[3]);
  }
  for (int32_t t : pending_) st.add_pending(t);
  st.set_pending_len(pending_len_);
  st.set_pending_root(pending_root_);
  st.set_pending_n(pending_n_);
  st.set_plain_run(plain_run_);
  return st.SerializeAsString();
}

absl::Status NgramStrategy::LoadState(std::string_view bytes) {
  state::NgramStrategyState st;
  if (!st.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("malformed n-gram strategy state: it does not parse");
  }
  // Same parameters, or the restored strategy would not continue as the saved one.
  const auto same_beta = [](double a, double b) {
    return a == b || (std::isnan(a) && std::isnan(b));
  };
  const std::pair<const char*, bool> checks[] = {
      {"max_ngram", st.max_ngram() == params_.max_ngram},
      {"min_ngram", st.min_ngram() == params_.min_ngram},
      {"max_draft", st.max_draft() == params_.max_draft},
      {"start_draft", st.start_draft() == params_.start_draft},
      {"max_skip", st.max_skip() == params_.max_skip},
      {"adaptive", st.adaptive() == params_.adaptive},
      {"fixed_pass_cost_beta", same_beta(st.fixed_pass_cost_beta(), params_.fixed_pass_cost_beta)},
  };
  for (const auto& [field, same] : checks) {
    if (!same) {
      return absl::InvalidArgumentError(
          absl::StrCat("the saved n-gram strategy state has another NgramParams.", field,
                       " than this session's strategy: create the strategy with the parameters "
                       "it was saved with"));
    }
  }
  if (st.acceptance_size() != params_.max_ngram + 1) {
    return absl::DataLossError(
        absl::StrCat("malformed n-gram strategy state: ", st.acceptance_size(),
                     " acceptance estimates for ", params_.max_ngram + 1, " suffix lengths"));
  }
  std::vector<AcceptanceEstimate> acceptance(acceptance_.size());
  for (int i = 0; i < st.acceptance_size(); ++i) {
    const state::AcceptanceState& a = st.acceptance(i);
    if (!acceptance[i].SetCounts({a.s1(), a.f1(), a.s(), a.f()})) {
      return absl::DataLossError(absl::StrCat(
          "malformed n-gram strategy state: acceptance estimate ", i, " is out of range"));
    }
  }
  // The pending candidate indexes the context (pending_len - 1) and the estimates (pending_n).
  if (st.pending_size() > params_.max_draft || st.pending_len() < 0 ||
      (st.pending_size() > 0 && st.pending_len() < 1) || st.pending_n() < 0 ||
      st.pending_n() > params_.max_ngram || st.plain_run() < 0) {
    return absl::DataLossError("malformed n-gram strategy state: pending candidate out of range");
  }
  acceptance_ = std::move(acceptance);
  pending_.assign(st.pending().begin(), st.pending().end());
  pending_len_ = st.pending_len();
  pending_root_ = st.pending_root();
  pending_n_ = st.pending_n();
  plain_run_ = st.plain_run();
  return absl::OkStatus();
}

int64_t NgramStrategy::FindMostRecent(std::span<const int32_t> context, int32_t n) {
  const int64_t len = static_cast<int64_t>(context.size());
  if (n <= 0 || len < n + 1) return -1;
  const int32_t* suffix = context.data() + (len - n);
  // Candidate starts i with i + n < len (followed by a token), newest first; the suffix itself
  // (i = len - n) is excluded.
  for (int64_t i = len - n - 1; i >= 0; --i) {
    if (context[i + n - 1] != suffix[n - 1]) continue;  // cheap check on the last token first
    if (std::equal(suffix, suffix + n, context.data() + i)) return i;
  }
  return -1;
}

void NgramStrategy::LearnFromPending(std::span<const int32_t> context) {
  const int64_t len = static_cast<int64_t>(context.size());
  // The context must continue the one the candidate was found for (a rewind or another
  // conversation drops the candidate unlearned).
  if (!pending_.empty() && len > pending_len_ && context[pending_len_ - 1] == pending_root_) {
    const int32_t checked =
        static_cast<int32_t>(std::min<int64_t>(len - pending_len_, pending_.size()));
    int32_t matched = 0;
    while (matched < checked && context[pending_len_ + matched] == pending_[matched]) ++matched;
    acceptance_[pending_n_].Observe(checked, matched);
  }
  pending_.clear();
}

absl::Status NgramStrategy::Propose(std::span<const int32_t> context, int32_t max_draft,
                                    const ProposeContext& ctx, DraftTree* out) {
  out->Clear();
  LearnFromPending(context);
  const int64_t len = static_cast<int64_t>(context.size());
  for (int32_t n = params_.max_ngram; n >= params_.min_ngram; --n) {
    const int64_t start = FindMostRecent(context, n);
    if (start < 0) continue;
    const int64_t from = start + n;
    const int64_t to = std::min<int64_t>(len, from + params_.max_draft);
    pending_.assign(context.begin() + from, context.begin() + to);
    pending_len_ = len;
    pending_root_ = context.back();
    pending_n_ = n;
    const int32_t available = std::min(max_draft, static_cast<int32_t>(pending_.size()));
    int32_t k = available;
    if (params_.adaptive) {
      PassCostModel fixed;
      const PassCostModel* cost = ctx.cost;
      if (params_.fixed_pass_cost_beta >= 0.0 || cost == nullptr) {
        fixed.Pin(params_.fixed_pass_cost_beta >= 0.0 ? params_.fixed_pass_cost_beta
                                                      : PassCostModel::kPriorBeta);
        cost = &fixed;
      }
      auto cost_of = [](const PassCostModel* c) {
        return [c](int32_t kk) { return c->RelativeCost(kk + 1); };
      };
      // While the cost is only the prior, draft at most start_draft tokens.
      const bool measured = !cost->pinned();
      const int32_t cap = measured && cost->wide_observations() == 0
                              ? std::min(available, params_.start_draft)
                              : available;
      k = BestDraftLength(acceptance_[n], cap, cost_of(cost));
      if (k == 0 && available > 0 && measured && params_.max_skip > 0 &&
          ++plain_run_ >= params_.max_skip) {
        // Re-measure a wide pass now and then (the backend or the load may have changed), but
        // only when its cost is what keeps the strategy from drafting: one token would pay at
        // half the measured slope.
        plain_run_ = 0;
        PassCostModel cheaper;
        cheaper.Pin(cost->Beta() / 2);
        if (BestDraftLength(acceptance_[n], 1, cost_of(&cheaper)) > 0) k = 1;
      }
      if (k > 0) plain_run_ = 0;
    }
    int32_t parent = -1;
    for (int32_t i = 0; i < k; ++i) parent = out->Add(pending_[i], parent);
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status NgramStrategy::MergeInto(std::span<const int32_t> context, int32_t max_draft,
                                      const ProposeContext& ctx, DraftTree* tree) {
  DraftTree chain;
  KILN_RETURN_IF_ERROR(Propose(context, std::max(0, max_draft - tree->size()), ctx, &chain));
  tree->MergeChain(chain.tokens);
  return absl::OkStatus();
}

void NgramStrategy::Accepted(int32_t /*drafted*/, std::span<const int32_t> /*accepted*/) {
  // Nothing to do: the next Propose compares the candidate with what actually followed it (the
  // accepted tokens and the recovered/bonus one), which is more than `accepted` tells.
}

}  // namespace kiln::spec
