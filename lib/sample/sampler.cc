#include "lib/sample/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "lib/common/status.h"
#include "lib/sample/fast_exp.h"

namespace kiln::sample {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Top-p histogram over (max_logit - logit): kBuckets buckets of kBucketWidth nats; the last bucket
// also takes everything further away (and is never split).
constexpr int kBuckets = 512;
constexpr float kBucketRange = 64.0f;
constexpr float kBucketScale = kBuckets / kBucketRange;

inline int BucketOf(float max_logit, float logit) {
  const float d = (max_logit - logit) * kBucketScale;  // >= 0
  return d < static_cast<float>(kBuckets - 1) ? static_cast<int>(d) : kBuckets - 1;
}

// Index of the first NaN or +inf value, or -1. Blocked so the common (all good) case is a
// branch-free vectorizable reduction.
int64_t FirstBadLogit(std::span<const float> v) {
  constexpr size_t kBlock = 1024;
  for (size_t begin = 0; begin < v.size(); begin += kBlock) {
    const size_t end = std::min(v.size(), begin + kBlock);
    int bad = 0;
    for (size_t i = begin; i < end; ++i) bad |= !(v[i] < kInf);
    if (bad) {
      for (size_t i = begin; i < end; ++i) {
        if (!(v[i] < kInf)) return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

// Maximum of a block with 8 independent lanes so the compiler can use packed max (a plain
// reduction `m = max(m, x)` is not vectorized without -ffast-math). No NaN here (validated).
float BlockMax(const float* v, size_t n) {
  float lanes[8] = {-kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] = v[i + j] > lanes[j] ? v[i + j] : lanes[j];
  }
  float m = -kInf;
  for (float x : lanes) m = x > m ? x : m;
  for (; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// Sum with float lanes inside 1024-element blocks (vectorized) and double across blocks.
double SumBlocks(const float* v, size_t n) {
  constexpr size_t kBlock = 1024;
  double total = 0.0;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
      for (int j = 0; j < 8; ++j) lanes[j] += v[i + j];
    }
    double block = 0.0;
    for (float x : lanes) block += x;
    for (; i < end; ++i) block += v[i];
    total += block;
  }
  return total;
}

float MaxLogit(std::span<const float> v) { return BlockMax(v.data(), v.size()); }

// Index of the maximum, lowest index on ties: block maxima in one vectorized pass, then a scan of
// the first block holding the maximum.
size_t ArgMax(std::span<const float> v) {
  constexpr size_t kBlock = 1024;
  float best = -kInf;
  size_t best_block = 0;
  for (size_t begin = 0; begin < v.size(); begin += kBlock) {
    const float m = BlockMax(v.data() + begin, std::min(kBlock, v.size() - begin));
    if (m > best) {
      best = m;
      best_block = begin;
    }
  }
  size_t i = best_block;
  while (i + 1 < v.size() && v[i] != best) ++i;
  return i;
}

}  // namespace

namespace {

using Cand = internal::ScoredToken;

// "Better" order: higher logit first, then lower token id.
inline bool Better(const Cand& a, const Cand& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// The k best (logit desc, index asc) finite entries of `values`, sorted best first.
void TopKCandidates(std::span<const float> values, size_t k, std::vector<Cand>* heap) {
  heap->clear();
  k = std::min(k, values.size());
  if (k == 0) return;
  heap->reserve(k);
  // Max-heap under `Better` as "less": the root is the worst kept entry.
  size_t i = 0;
  const size_t n = values.size();
  for (; i < n && heap->size() < k; ++i) {
    if (values[i] == -kInf) continue;
    heap->push_back({values[i], static_cast<int32_t>(i)});
    std::push_heap(heap->begin(), heap->end(), Better);
  }
  if (heap->size() == k) {
    float threshold = heap->front().logit;
    for (; i < n; ++i) {
      // A later index with an equal logit is worse than every kept entry: strict >.
      if (values[i] > threshold) {
        std::pop_heap(heap->begin(), heap->end(), Better);
        heap->back() = {values[i], static_cast<int32_t>(i)};
        std::push_heap(heap->begin(), heap->end(), Better);
        threshold = heap->front().logit;
      }
    }
  }
  std::sort_heap(heap->begin(), heap->end(), Better);
}

// Sorts best first (logit desc, token asc). Large sets sort 64-bit keys (order-preserving float
// bits inverted, then the token) instead of calling a comparator: about twice as fast.
void SortBetterFirst(std::vector<Cand>* cands) {
  if (cands->size() < 256) {
    std::sort(cands->begin(), cands->end(), Better);
    return;
  }
  std::vector<uint64_t> keys(cands->size());
  for (size_t i = 0; i < cands->size(); ++i) {
    // + 0.0f turns -0 into +0 so both zeros tie, as they do under Better().
    const uint32_t bits = std::bit_cast<uint32_t>((*cands)[i].logit + 0.0f);
    // Ascending order-preserving map of IEEE floats (no NaN here), then inverted for "desc".
    const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    keys[i] = (static_cast<uint64_t>(~ordered) << 32) | static_cast<uint32_t>((*cands)[i].token);
  }
  std::sort(keys.begin(), keys.end());
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t ordered = ~static_cast<uint32_t>(keys[i] >> 32);
    const uint32_t bits = (ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered;
    (*cands)[i] = {std::bit_cast<float>(bits), static_cast<int32_t>(keys[i] & 0xffffffffu)};
  }
}

}  // namespace

void SelectTopK(std::span<const float> values, int32_t k, std::vector<int32_t>* indices) {
  std::vector<Cand> heap;
  TopKCandidates(values, k > 0 ? static_cast<size_t>(k) : 0, &heap);
  indices->clear();
  for (const Cand& c : heap) indices->push_back(c.token);
}

Sampler::Sampler(SamplerParams params)
    : params_(std::move(params)), params_status_(Validate(params_)) {}

absl::Status Sampler::Validate(const SamplerParams& p) {
  const auto bad = [](const char* field, double value, const char* why) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SamplerParams.%s = %g: %s", field, value, why));
  };
  if (std::isnan(p.repeat_penalty) || !(p.repeat_penalty > 0.0f) || std::isinf(p.repeat_penalty)) {
    return bad("repeat_penalty", p.repeat_penalty, "must be a finite number > 0 (1 = off)");
  }
  if (!std::isfinite(p.frequency_penalty)) {
    return bad("frequency_penalty", p.frequency_penalty, "must be finite");
  }
  if (!std::isfinite(p.presence_penalty)) {
    return bad("presence_penalty", p.presence_penalty, "must be finite");
  }
  if (std::isnan(p.typical_p)) return bad("typical_p", p.typical_p, "is NaN");
  if (std::isnan(p.top_p)) return bad("top_p", p.top_p, "is NaN");
  if (std::isnan(p.min_p)) return bad("min_p", p.min_p, "is NaN");
  if (std::isnan(p.temperature) || std::isinf(p.temperature)) {
    return bad("temperature", p.temperature, "must be finite (<= 0 = greedy)");
  }
  if (p.penalty_last_n < -1) {
    return bad("penalty_last_n", p.penalty_last_n, "must be >= -1 (-1 = whole history)");
  }
  if (p.n_logprobs < 0) return bad("n_logprobs", p.n_logprobs, "must be >= 0");
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const float b = p.logit_bias[i].bias;
    if (std::isnan(b) || b == kInf) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SamplerParams.logit_bias[%d].bias = %g: must be finite or -inf", i, b));
    }
  }
  return absl::OkStatus();
}

absl::Status Sampler::ApplyBiasAndPenalties(std::span<const float> logits,
                                            std::span<const int32_t> history,
                                            std::span<const float>* view) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < params_.logit_bias.size(); ++i) {
    const int32_t t = params_.logit_bias[i].token;
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SamplerParams.logit_bias[%d].token = %d is outside the vocabulary [0, %d)", i, t,
          vocab));
    }
  }
  const bool penalties_on = params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
                            params_.presence_penalty != 0.0f;
  size_t window = 0;
  if (penalties_on && params_.penalty_last_n != 0) {
    window = params_.penalty_last_n < 0
                 ? history.size()
                 : std::min(history.size(), static_cast<size_t>(params_.penalty_last_n));
  }
  const size_t first = history.size() - window;
  for (size_t i = first; i < history.size(); ++i) {
    if (history[i] < 0 || history[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "history[%d] = %d is outside the vocabulary [0, %d)", i, history[i], vocab));
    }
  }
  if (params_.logit_bias.empty() && window == 0) {
    *view = logits;
    return absl::OkStatus();
  }
  work_logits_.assign(logits.begin(), logits.end());  // [vocab]
  for (const LogitBias& b : params_.logit_bias) work_logits_[b.token] += b.bias;
  if (window > 0) {
    window_.assign(history.begin() + first, history.end());
    std::sort(window_.begin(), window_.end());
    for (size_t i = 0; i < window_.size();) {
      size_t j = i;
      while (j < window_.size() && window_[j] == window_[i]) ++j;
      const int32_t token = window_[i];
      const float count = static_cast<float>(j - i);
      float& l = work_logits_[token];
      if (params_.repeat_penalty != 1.0f) {
        l = l <= 0.0f ? l * params_.repeat_penalty : l / params_.repeat_penalty;
      }
      l -= count * params_.frequency_penalty + params_.presence_penalty;
      i = j;
    }
  }
  *view = work_logits_;
  return absl::OkStatus();
}

absl::Status Sampler::CollectCandidates(std::span<const float> view, bool* truncated_exactly) {
  const size_t vocab = view.size();
  *truncated_exactly = false;
  std::vector<Cand>& cands = candidates_;
  const bool top_k_on = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab;
  const bool typical_on = params_.typical_p < 1.0f;
  if (top_k_on) {
    TopKCandidates(view, static_cast<size_t>(params_.top_k), &cands);
  } else {
    const float max_logit = MaxLogit(view);
    if (max_logit == -kInf) {
      return absl::FailedPreconditionError(
          "no candidate tokens: every logit is -inf after logit bias and penalties");
    }
    const bool top_p_on = !typical_on && params_.top_p < 1.0f;
    const bool min_p_on = !typical_on && params_.min_p > 0.0f;
    // Exact min-p threshold in logit space: p >= min_p * p_max <=> logit >= max + log(min_p).
    const float min_logit = min_p_on ? max_logit + std::log(params_.min_p) : -kInf;
    cands.clear();
    if (top_p_on) {
      // One exp pass: mass per distance-from-max bucket, then the bucket where the cumulative
      // mass from the top reaches top_p. Only tokens in buckets up to it (plus one bucket of slack
      // for rounding) are collected and sorted; the exact cut is made below.
      exp_.resize(vocab);  // [vocab] e^(logit - max), vectorized
      FastExpShifted(view.data(), max_logit, exp_.data(), vocab);
      std::vector<double>& mass = bucket_mass_;
      mass.assign(kBuckets, 0.0);
      for (size_t i = 0; i < vocab; ++i) mass[BucketOf(max_logit, view[i])] += exp_[i];
      const double z = std::accumulate(mass.begin(), mass.end(), 0.0);
      const double target = static_cast<double>(params_.top_p) * z;
      int last_bucket = kBuckets - 1;
      double cum = 0.0;
      for (int b = 0; b < kBuckets; ++b) {
        cum += mass[b];
        if (cum >= target) {
          last_bucket = std::min(kBuckets - 1, b + 1);
          break;
        }
      }
      for (size_t i = 0; i < vocab; ++i) {
        const float l = view[i];
        if (l == -kInf || l < min_logit || BucketOf(max_logit, l) > last_bucket) continue;
        cands.push_back({l, static_cast<int32_t>(i)});
      }
      SortBetterFirst(&cands);
      // Exact nucleus: the shortest prefix with mass >= top_p * z (at least one token).
      cum = 0.0;
      for (size_t i = 0; i < cands.size(); ++i) {
        cum += exp_[cands[i].token];  // the same values the histogram summed
        if (cum >= target) {
          cands.resize(i + 1);
          break;
        }
      }
    } else {
      for (size_t i = 0; i < vocab; ++i) {
        const float l = view[i];
        if (l == -kInf || l < min_logit) continue;
        cands.push_back({l, static_cast<int32_t>(i)});
      }
      SortBetterFirst(&cands);
    }
    *truncated_exactly = !typical_on;
  }
  if (cands.empty()) {
    return absl::FailedPreconditionError(
        "no candidate tokens: every logit is -inf after logit bias and penalties");
  }
  return absl::OkStatus();
}

namespace {
// probs[i] = softmax over cands at temperature 1, in double.
void Softmax(const std::vector<Cand>& cands, std::vector<double>* probs) {
  probs->resize(cands.size());
  const float max_logit = cands[0].logit;
  double sum = 0.0;
  for (size_t i = 0; i < cands.size(); ++i) {
    (*probs)[i] = std::exp(static_cast<double>(cands[i].logit - max_logit));
    sum += (*probs)[i];
  }
  for (double& p : *probs) p /= sum;
}
}  // namespace

void Sampler::ApplyTypical() {
  std::vector<Cand>& cands = candidates_;
  if (!(params_.typical_p < 1.0f) || cands.size() <= 1) return;
  Softmax(cands, &probs_);
  double entropy = 0.0;
  for (double p : probs_) {
    if (p > 0.0) entropy -= p * std::log(p);
  }
  // Order by |-log p - H| ascending; stable so equal scores keep the (logit, id) order.
  std::vector<std::pair<double, size_t>> scored(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    const double surprise = probs_[i] > 0.0 ? -std::log(probs_[i]) : kInf;
    scored[i] = {std::fabs(surprise - entropy), i};
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t keep = scored.size();
  double cum = 0.0;
  for (size_t i = 0; i < scored.size(); ++i) {
    cum += probs_[scored[i].second];
    if (cum > params_.typical_p) {  // strictly greater, as llama.cpp
      keep = i + 1;
      break;
    }
  }
  std::vector<Cand> kept(keep);
  for (size_t i = 0; i < keep; ++i) kept[i] = cands[scored[i].second];
  std::sort(kept.begin(), kept.end(), Better);
  cands.swap(kept);
}

void Sampler::ApplyTopP() {
  std::vector<Cand>& cands = candidates_;
  if (!(params_.top_p < 1.0f) || cands.size() <= 1) return;
  Softmax(cands, &probs_);
  double cum = 0.0;
  for (size_t i = 0; i < cands.size(); ++i) {
    cum += probs_[i];
    if (cum >= params_.top_p) {
      cands.resize(i + 1);
      return;
    }
  }
}

void Sampler::ApplyMinP() {
  std::vector<Cand>& cands = candidates_;
  if (!(params_.min_p > 0.0f) || cands.size() <= 1) return;
  const float min_logit = cands[0].logit + std::log(params_.min_p);
  size_t keep = 1;
  while (keep < cands.size() && cands[keep].logit >= min_logit) ++keep;
  cands.resize(keep);
}

void Sampler::Finish(Distribution* out) {
  const std::vector<Cand>& cands = candidates_;
  out->candidates.clear();
  if (params_.temperature <= 0.0f) {
    out->candidates.push_back({cands[0].token, 1.0f});
    return;
  }
  const double inv_t = 1.0 / params_.temperature;
  probs_.resize(cands.size());
  const float max_logit = cands[0].logit;
  double sum = 0.0;
  for (size_t i = 0; i < cands.size(); ++i) {
    probs_[i] = std::exp(static_cast<double>(cands[i].logit - max_logit) * inv_t);
    sum += probs_[i];
  }
  out->candidates.reserve(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    const float p = static_cast<float>(probs_[i] / sum);
    if (!(p > 0.0f)) break;  // sorted: everything after underflowed too
    out->candidates.push_back({cands[i].token, p});
  }
}

void Sampler::FillLogprobs(std::span<const float> logits, Distribution* out) {
  if (params_.n_logprobs <= 0) return;
  const float max_logit = MaxLogit(logits);
  exp_.resize(logits.size());
  FastExpShifted(logits.data(), max_logit, exp_.data(), logits.size());
  const double sum = SumBlocks(exp_.data(), exp_.size());
  const double log_z = max_logit + std::log(sum);
  out->raw_log_normalizer = log_z;
  std::vector<Cand> top;
  TopKCandidates(logits, static_cast<size_t>(params_.n_logprobs), &top);
  for (const Cand& c : top) {
    out->top_logprobs.push_back({c.token, static_cast<float>(c.logit - log_z)});
  }
}

absl::Status Sampler::Apply(std::span<const float> logits, std::span<const int32_t> history,
                            Distribution* out) {
  KILN_RETURN_IF_ERROR(params_status_);
  if (out == nullptr) return absl::InvalidArgumentError("Sampler::Apply: out is null");
  if (logits.empty()) return absl::InvalidArgumentError("Sampler::Apply: logits is empty");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("Sampler::Apply: more than 2^31-1 logits");
  }
  const int64_t bad = FirstBadLogit(logits);
  if (bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("logits[%d] = %f: NaN and +inf logits are not allowed", bad, logits[bad]));
  }
  std::span<const float> view;  // [vocab] after bias and penalties
  KILN_RETURN_IF_ERROR(ApplyBiasAndPenalties(logits, history, &view));
  out->vocab_size = static_cast<int32_t>(logits.size());
  out->candidates.clear();
  out->top_logprobs.clear();
  out->raw_log_normalizer = 0.0;

  const bool greedy = params_.temperature <= 0.0f;
  if (greedy && !(params_.typical_p < 1.0f)) {
    // Every remaining truncation stage keeps the best token: plain argmax, ties -> lowest id.
    const size_t best = ArgMax(view);
    if (view[best] == -kInf) {
      return absl::FailedPreconditionError(
          "no candidate tokens: every logit is -inf after logit bias and penalties");
    }
    out->candidates.push_back({static_cast<int32_t>(best), 1.0f});
    FillLogprobs(logits, out);
    return absl::OkStatus();
  }

  bool truncated_exactly = false;
  KILN_RETURN_IF_ERROR(CollectCandidates(view, &truncated_exactly));
  ApplyTypical();
  if (!truncated_exactly) {
    ApplyTopP();
    ApplyMinP();
  }
  Finish(out);
  FillLogprobs(logits, out);
  return absl::OkStatus();
}

int32_t Sampler::SampleWithUniform(const Distribution& dist, double u) {
  const std::vector<TokenProb>& c = dist.candidates;
  if (c.empty()) return -1;
  double total = 0.0;
  for (const TokenProb& tp : c) total += tp.prob;
  const double target = u * total;
  double cum = 0.0;
  for (const TokenProb& tp : c) {
    cum += tp.prob;
    if (target < cum) return tp.token;
  }
  return c.back().token;  // u * total rounded up to total
}

int32_t Sampler::Sample(const Distribution& dist, Rng& rng) {
  if (dist.candidates.empty()) return -1;
  if (dist.candidates.size() == 1) return dist.candidates[0].token;
  return SampleWithUniform(dist, rng.NextDouble());
}

absl::StatusOr<int32_t> Sampler::Next(std::span<const float> logits,
                                      std::span<const int32_t> history, Rng& rng) {
  KILN_RETURN_IF_ERROR(Apply(logits, history, &scratch_dist_));
  return Sample(scratch_dist_, rng);
}

}  // namespace kiln::sample
