#include "lib/engine/draft_policy.h"

#include <algorithm>
#include <cmath>

namespace kiln::spec {

void PassCostModel::Observe(int32_t width, double seconds) {
  if (pinned_ || width < 1 || !(seconds > 0.0)) return;
  if (width == 1) {
    t1_ = n1_ == 0 ? seconds : t1_ + kEmaWeight * (seconds - t1_);
    ++n1_;
    return;
  }
  if (n1_ == 0) return;  // no reference yet: the extra cost of a row cannot be separated
  const double per_extra = (seconds - t1_) / (width - 1);
  slope_ = n_wide_ == 0 ? per_extra : slope_ + kEmaWeight * (per_extra - slope_);
  ++n_wide_;
  if (width <= kMaxTimedWidth) {
    double& t = t_width_[width];
    t = t == 0.0 || n_wide_ - seen_at_[width] > kStaleAfter ? seconds
                                                            : t + kEmaWeight * (seconds - t);
    seen_at_[width] = n_wide_;
  }
}

double PassCostModel::RelativeCost(int32_t width) const {
  if (width <= 1) return 1.0;
  if (!pinned_ && width <= kMaxTimedWidth && t_width_[width] > 0.0 && t1_ > 0.0 &&
      n_wide_ - seen_at_[width] <= kStaleAfter) {
    return std::clamp(t_width_[width] / t1_, 1.0, 1.0 + 4.0 * (width - 1));
  }
  return 1.0 + Beta() * (width - 1);
}

double PassCostModel::Beta() const {
  if (pinned_) return pinned_beta_;
  if (n1_ == 0 || n_wide_ == 0 || !(t1_ > 0.0)) return kPriorBeta;
  // A row can cost at most a few one-token passes (clamp the noise of single measurements).
  return std::clamp(slope_ / t1_, 0.0, 4.0);
}

bool AcceptanceEstimate::SetCounts(const std::array<double, 4>& c) {
  for (double x : c) {
    if (!std::isfinite(x) || x < 0.0) return false;
  }
  if (!(c[0] + c[1] > 0.0) || !(c[2] + c[3] > 0.0)) return false;
  s1_ = c[0];
  f1_ = c[1];
  s_ = c[2];
  f_ = c[3];
  return true;
}

void AcceptanceEstimate::Reset() { s1_ = f1_ = s_ = f_ = 1.0; }

void AcceptanceEstimate::Observe(int32_t checked, int32_t matched) {
  if (checked <= 0) return;
  matched = std::clamp(matched, 0, checked);
  s1_ *= kDecay;
  f1_ *= kDecay;
  s_ *= kDecay;
  f_ *= kDecay;
  if (matched == 0) {
    f1_ += 1.0;
    return;
  }
  s1_ += 1.0;
  s_ += matched - 1;  // tokens 1 .. matched - 1
  if (matched < checked) f_ += 1.0;
}

double AcceptanceEstimate::ExpectedAccepted(int32_t k) const {
  const double a = next();
  double sum = 0.0, term = first();
  for (int32_t i = 0; i < k; ++i) {
    sum += term;
    term *= a;
  }
  return sum;
}

int32_t BestDraftLength(const AcceptanceEstimate& acceptance, int32_t max_k,
                        const std::function<double(int32_t k)>& cost, double margin) {
  int32_t best_k = 0;
  double best = 1.0 + margin;  // plain decoding: 1 token per unit cost, plus the margin
  for (int32_t k = 1; k <= max_k; ++k) {
    const double c = cost(k);
    if (!(c > 0.0)) continue;
    const double value = (1.0 + acceptance.ExpectedAccepted(k)) / c;
    if (value > best) {
      best = value;
      best_k = k;
    }
  }
  return best_k;
}

}  // namespace kiln::spec
