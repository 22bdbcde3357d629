// Cost-aware draft length: the pieces a strategy needs to decide how many tokens to draft.
//
//   PassCostModel      what a target pass over w tokens costs, relative to a one-token pass:
//                      c(w) = t(w) / t(1), the measured step times of each width (moving
//                      averages kept by the decoder), and c(w) = 1 + beta (w - 1) for widths not
//                      measured yet, beta the measured slope (or pinned for reproducibility);
//   AcceptanceEstimate how likely drafts of a strategy are to be accepted, estimated online: the
//                      first draft token is accepted with probability a1, each following one
//                      (given its predecessor was) with probability a, so
//                      E[accepted | k] = a1 (1 + a + ... + a^(k-1));
//   BestDraftLength    the k in [0, max_k] maximising expected tokens per unit cost,
//                      (1 + E[accepted | k]) / cost(k), where cost(0) = 1 (plain decoding) and
//                      cost(k) = c(k + 1) + extra(k) (extra: a draft model's own passes).
//
// Why measured, not constant: the relative cost of a wide pass depends on the backend (with
// per-token matmuls a pass over w tokens cost about 1 + 0.8 (w - 1) on the default model; the
// rows x tokens tile kernels, which read each weight once, brought it to about 1 + 0.3 (w - 1),
// the integer-order kernels of the default numeric mode to about 1 + 0.2 (w - 1)),
// on the thread count and on the machine's load. The policy follows whatever the decoder
// measures. Why per width, not one slope: a pass is bound by the weight stream until its compute
// catches up, so on the default model at one thread c(2) is about 1.0 and c(3) about 1.06 while
// each token beyond costs about 0.2 (engine_bench --widths); one slope would overcharge the
// short drafts that cost nearly nothing and undercharge the long ones.
//
// Determinism: in greedy mode the emitted tokens never depend on the draft length (the verifier
// keeps exactly the target's argmax path), so a timing-driven policy cannot change greedy output.
// With sampling, the draft length changes how the random stream is consumed, so a measured cost
// makes the text for a fixed seed depend on timing; pin the cost (PassCostModel::Pin, or the
// strategies' fixed-cost parameters) where the same seed must give the same text.
//
// Thread-safety: plain values; none of the methods may be called concurrently on one object.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

namespace kiln::spec {

class PassCostModel {
 public:
  // beta used until a wide pass has been measured (and its one-token reference).
  static constexpr double kPriorBeta = 0.5;

  // Records one decoder step over `width` tokens (root + drafts) that took `seconds` (target
  // forward plus the per-row sampling and verification). Ignored while pinned or for width < 1
  // or seconds <= 0.
  void Observe(int32_t width, double seconds);

  // The cost of a pass over `width` tokens in one-token passes: t(width) / t(1) when that width
  // was measured within the last kStaleAfter wider steps (clamped to [1, 1 + 4 (width - 1)]),
  // else 1 + beta (width - 1), so a width that looked expensive once is tried again when the
  // slope says it may pay; pinned: always 1 + beta (width - 1).
  double RelativeCost(int32_t width) const;
  // The current slope (measured, pinned or the prior), >= 0.
  double Beta() const;
  // Measured seconds of a one-token step (exponential moving average); 0 until one was seen.
  double OneTokenSeconds() const { return t1_; }
  // Number of one-token and wider steps observed.
  int64_t one_token_observations() const { return n1_; }
  int64_t wide_observations() const { return n_wide_; }

  // Widths up to this one keep their own step time; wider ones use the slope.
  static constexpr int32_t kMaxTimedWidth = 32;
  static constexpr int64_t kStaleAfter = 64;

  // Pins beta (>= 0): Observe is ignored from now on and RelativeCost is deterministic.
  void Pin(double beta) {
    pinned_ = true;
    pinned_beta_ = beta < 0 ? 0 : beta;
  }
  bool pinned() const { return pinned_; }

  // Every field, for saving a session (lib/session/session_state.h) and restoring it bit for
  // bit: Restore(snapshot()) gives a model that answers exactly as this one.
  struct Snapshot {
    double t1 = 0.0;
    double slope = 0.0;
    std::array<double, kMaxTimedWidth + 1> t_width{};
    std::array<int64_t, kMaxTimedWidth + 1> seen_at{};
    int64_t n1 = 0;
    int64_t n_wide = 0;
    bool pinned = false;
    double pinned_beta = 0.0;
  };
  Snapshot snapshot() const {
    return {t1_, slope_, t_width_, seen_at_, n1_, n_wide_, pinned_, pinned_beta_};
  }
  void Restore(const Snapshot& s) {
    t1_ = s.t1;
    slope_ = s.slope;
    t_width_ = s.t_width;
    seen_at_ = s.seen_at;
    n1_ = s.n1;
    n_wide_ = s.n_wide;
    pinned_ = s.pinned;
    pinned_beta_ = s.pinned_beta;
  }

 private:
  // Weight of a new observation in the moving averages (about the last 10 steps matter).
  static constexpr double kEmaWeight = 0.1;

  double t1_ = 0.0;     // EMA of one-token step seconds
  double slope_ = 0.0;  // EMA of (t(w) - t1) / (w - 1), seconds per extra token
  // EMA of the step seconds of each width in [2, kMaxTimedWidth] (0: not seen yet), and
  // n_wide_ when it was last observed.
  std::array<double, kMaxTimedWidth + 1> t_width_{};
  std::array<int64_t, kMaxTimedWidth + 1> seen_at_{};
  int64_t n1_ = 0;
  int64_t n_wide_ = 0;
  bool pinned_ = false;
  double pinned_beta_ = 0.0;
};

class AcceptanceEstimate {
 public:
  // Prior pseudo-observations: one success and one failure at each level (a1 = a = 0.5).
  AcceptanceEstimate() { Reset(); }
  void Reset();

  // One verified (or, for a strategy that can check it for free, would-be) draft of which
  // `checked` tokens could be compared with the truth and the first `matched` (<= checked) were
  // right. Tokens 0 .. matched - 1 are successes and token `matched`, when matched < checked, a
  // failure (later tokens were never trials); token 0 counts for a1, the others for a.
  // checked <= 0 is ignored.
  void Observe(int32_t checked, int32_t matched);

  // The pseudo-counts {s1, f1, s, f} (successes and failures of the first and the later draft
  // tokens), for saving a session; SetCounts restores them. SetCounts refuses (returns false,
  // changes nothing) counts that are negative, non-finite, or leave a level without evidence
  // (s1 + f1 or s + f not positive), which no sequence of observations produces.
  std::array<double, 4> counts() const { return {s1_, f1_, s_, f_}; }
  bool SetCounts(const std::array<double, 4>& counts);

  double first() const { return s1_ / (s1_ + f1_); }  // a1
  double next() const { return s_ / (s_ + f_); }      // a
  // E[accepted | k] = a1 (1 + a + ... + a^(k-1)).
  double ExpectedAccepted(int32_t k) const;

 private:
  // Decay of old evidence per observation (about the last 25 drafts matter).
  static constexpr double kDecay = 0.96;
  double s1_, f1_, s_, f_;
};

// argmax over k in [0, max_k] of (1 + E[accepted | k]) / cost(k), cost(0) = 1. A k > 0 must beat
// plain decoding by `margin` (relative; noise in the measured cost should not make it speculate
// for nothing). Ties go to the shorter draft.
int32_t BestDraftLength(const AcceptanceEstimate& acceptance, int32_t max_k,
                        const std::function<double(int32_t k)>& cost, double margin = 0.02);

}  // namespace kiln::spec
