// N-gram prompt lookup (no model): match the last n tokens of the context (n = max_ngram, then
// smaller, down to min_ngram) against the earlier context (prompt and output so far), take the
// most recent match and propose the tokens that followed it, up to max_draft of them, as a
// deterministic chain. Exact under sampling too (q one-hot, rejection_sampler.h).
//
// Back-off (so it does not cost when it does not pay): verifying k draft tokens makes the target
// pass wider (on the CPU a pass over 9 tokens costs about twice a pass over one), so
//   - a 1-token suffix is not matched by default (min_ngram = 2): in chat text single tokens
//     match everywhere and what followed them is rarely what comes next;
//   - the draft length adapts: it starts at start_draft, doubles (up to max_draft) after a fully
//     accepted draft, drops to accepted + 1 after a partial acceptance and halves after a miss;
//   - after a step where nothing was accepted the strategy proposes nothing for a while (the
//     step is plain decoding): 1 step after the first miss, doubling with each consecutive miss
//     up to max_skip; any accepted token resets it.
//
// Thread-safety: none (see strategy.h).
#pragma once

#include "lib/spec/strategy.h"

namespace kiln::spec {

struct NgramParams {
  int32_t max_ngram = 3;    // longest suffix tried first (>= min_ngram)
  int32_t min_ngram = 2;    // shortest suffix tried (>= 1)
  int32_t max_draft = 8;    // tokens proposed at most per step
  int32_t start_draft = 4;  // initial adaptive draft length, in [1, max_draft]
  int32_t max_skip = 32;    // longest back-off, in steps (0: never back off)
  bool adaptive = true;     // adapt the draft length and back off (false: always max_draft)
};

class NgramStrategy final : public Strategy {
 public:
  // InvalidArgument naming the field for bad parameters.
  static absl::StatusOr<std::unique_ptr<NgramStrategy>> Create(const NgramParams& params);

  std::string_view name() const override { return "ngram"; }
  absl::Status Propose(std::span<const int32_t> context, int32_t max_draft,
                       const ProposeContext& ctx, DraftTree* out) override;
  void Accepted(int32_t drafted, std::span<const int32_t> accepted) override;
  void Reset() override;

  // Start of the most recent earlier occurrence of the last n tokens of `context` (an occurrence
  // that is followed by at least one token), or -1. Exposed for tests.
  static int64_t FindMostRecent(std::span<const int32_t> context, int32_t n);

 private:
  explicit NgramStrategy(const NgramParams& params) : params_(params) { Reset(); }

  NgramParams params_;
  int32_t skip_left_ = 0;  // steps to propose nothing
  int32_t misses_ = 0;     // consecutive steps with nothing accepted
  int32_t draft_len_ = 0;  // current adaptive draft length
};

}  // namespace kiln::spec
