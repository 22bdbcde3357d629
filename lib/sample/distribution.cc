#include "lib/sample/distribution.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/common/status.h"

namespace kiln::sample {

float Distribution::ProbOf(int32_t token) const {
  for (const TokenProb& c : candidates) {
    if (c.token == token) return c.prob;
  }
  return 0.0f;
}

Distribution Distribution::OneHot(int32_t vocab_size, int32_t token) {
  Distribution d;
  d.vocab_size = vocab_size;
  d.candidates.push_back({token, 1.0f});
  return d;
}

absl::StatusOr<Distribution> Distribution::FromWeights(std::span<const double> weights) {
  if (weights.empty()) return absl::InvalidArgumentError("FromWeights: weights is empty");
  if (weights.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("FromWeights: more than 2^31-1 weights");
  }
  double total = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double w = weights[i];
    if (!(w >= 0.0) || std::isinf(w)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "FromWeights: weights[%d] = %g is not a finite non-negative number", i, w));
    }
    total += w;
  }
  if (!(total > 0.0)) return absl::InvalidArgumentError("FromWeights: all weights are zero");
  Distribution d;
  d.vocab_size = static_cast<int32_t>(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const float p = static_cast<float>(weights[i] / total);
    if (p > 0.0f) d.candidates.push_back({static_cast<int32_t>(i), p});
  }
  std::stable_sort(d.candidates.begin(), d.candidates.end(),
                   [](const TokenProb& a, const TokenProb& b) { return a.prob > b.prob; });
  return d;
}

double TotalVariation(const Distribution& a, const Distribution& b) {
  std::vector<TokenProb> sa = a.candidates;
  std::vector<TokenProb> sb = b.candidates;
  const auto by_token = [](const TokenProb& x, const TokenProb& y) { return x.token < y.token; };
  std::sort(sa.begin(), sa.end(), by_token);
  std::sort(sb.begin(), sb.end(), by_token);
  double sum = 0.0;
  size_t i = 0, j = 0;
  while (i < sa.size() || j < sb.size()) {
    if (j == sb.size() || (i < sa.size() && sa[i].token < sb[j].token)) {
      sum += sa[i++].prob;
    } else if (i == sa.size() || sb[j].token < sa[i].token) {
      sum += sb[j++].prob;
    } else {
      sum += std::fabs(static_cast<double>(sa[i++].prob) - sb[j++].prob);
    }
  }
  return 0.5 * sum;
}

}  // namespace kiln::sample
