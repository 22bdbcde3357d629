#include "lib/spec/ngram_strategy.h"

#include <algorithm>
#include <memory>

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
  skip_left_ = 0;
  misses_ = 0;
  draft_len_ = params_.start_draft;
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

absl::Status NgramStrategy::Propose(std::span<const int32_t> context, int32_t max_draft,
                                    const ProposeContext& /*ctx*/, DraftTree* out) {
  out->Clear();
  if (params_.adaptive && skip_left_ > 0) {
    --skip_left_;
    return absl::OkStatus();
  }
  const int32_t k = std::min(max_draft, params_.adaptive ? draft_len_ : params_.max_draft);
  if (k <= 0) return absl::OkStatus();
  const int64_t len = static_cast<int64_t>(context.size());
  for (int32_t n = params_.max_ngram; n >= params_.min_ngram; --n) {
    const int64_t start = FindMostRecent(context, n);
    if (start < 0) continue;
    const int64_t from = start + n;
    const int64_t to = std::min<int64_t>(len, from + k);
    int32_t parent = -1;
    for (int64_t i = from; i < to; ++i) parent = out->Add(context[i], parent);
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

void NgramStrategy::Accepted(int32_t drafted, std::span<const int32_t> accepted) {
  if (!params_.adaptive || drafted == 0) return;
  const int32_t m = static_cast<int32_t>(accepted.size());
  if (m == 0) {
    ++misses_;
    skip_left_ = std::min(params_.max_skip, 1 << std::min(misses_ - 1, 20));
    draft_len_ = std::max(1, draft_len_ / 2);
    return;
  }
  misses_ = 0;
  if (m == drafted) {
    draft_len_ = std::min(params_.max_draft, draft_len_ * 2);
  } else {
    draft_len_ = std::max(1, std::min(params_.max_draft, m + 1));
  }
}

}  // namespace kiln::spec
