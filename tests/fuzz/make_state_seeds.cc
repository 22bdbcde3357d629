// kiln-state-seeds OUT_DIR: writes seed inputs for state_reader_fuzz (run_fuzz.sh calls it):
// valid session states for the fuzz target's dimensions (tests/fuzz/state_fuzz_target.h), each
// twice: as a whole state (first byte 0) and as a bare payload (first byte 1, the fuzzer wraps
// it in a valid envelope). Seeds: tokens only; K/V of every token with logits; K/V of all but
// the pending last token; K/V whose sliding layer starts at row 10; a speculative section with a
// pass-cost model and an n-gram state.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "lib/session/session_state.h"
#include "tests/fuzz/state_fuzz_target.h"

namespace {

using kiln::state::SessionState;

SessionState Base(int n_tokens) {
  const kiln::state::StateTarget t = kiln::fuzz::StateFuzzTarget();
  SessionState s;
  s.mutable_model()->set_hash(t.model_fingerprint);
  s.mutable_model()->set_description(t.model_description);
  for (int i = 0; i < n_tokens; ++i) s.add_tokens((i * 7 + 3) % 300);
  s.mutable_sampler()->set_temperature(0.8f);
  s.mutable_sampler()->set_top_k(40);
  s.mutable_sampler()->set_top_p(0.95f);
  s.mutable_sampler()->set_repeat_penalty(1.0f);
  s.mutable_sampler()->set_penalty_last_n(64);
  kiln::state::LogitBias* bias = s.mutable_sampler()->add_logit_bias();
  bias->set_token(2);
  bias->set_bias(-1.0f);
  for (uint64_t w : {1ULL, 2ULL, 3ULL, 4ULL}) s.add_rng_state(w);
  return s;
}

// K/V of n_computed tokens; the sliding layer's tiles from sliding_first_row on.
void AddKv(SessionState* s, int n_computed, int sliding_first_row = 0) {
  const kiln::state::StateTarget t = kiln::fuzz::StateFuzzTarget();
  s->set_n_computed(n_computed);
  kiln::state::KvData* kv = s->mutable_kv();
  kv->set_elem_type(static_cast<uint32_t>(t.kv_type));
  kv->set_row_elems(static_cast<uint32_t>(t.kv_row_elems));
  kv->set_sliding_first_row(static_cast<uint32_t>(sliding_first_row));
  const int tiles_per_layer = t.kv_tiles / static_cast<int>(t.kv_sliding_layers.size());
  for (int i = 0; i < t.kv_tiles; ++i) {
    const int rows =
        t.kv_sliding_layers[i / tiles_per_layer] != 0 ? n_computed - sliding_first_row : n_computed;
    kv->add_tiles(std::string(static_cast<size_t>(rows) * t.kv_row_bytes, char('a' + i)));
  }
}

// Writes both forms of a seed that the reader accepts (a refused seed would fuzz the early checks
// only); false with a message otherwise.
bool Write(const std::string& dir, const std::string& name, const SessionState& s) {
  auto encoded = kiln::state::Encode(s);
  if (!encoded.ok()) return false;
  SessionState decoded;
  const absl::Status accepted =
      kiln::state::Decode(*encoded, kiln::fuzz::StateFuzzTarget(), &decoded);
  if (!accepted.ok()) {
    std::fprintf(stderr, "kiln-state-seeds: seed %s is refused: %s\n", name.c_str(),
                 std::string(accepted.message()).c_str());
    return false;
  }
  const std::string payload = s.SerializeAsString();
  for (int mode = 0; mode < 2; ++mode) {
    std::ofstream out(dir + "/" + name + (mode == 0 ? "-state" : "-payload"), std::ios::binary);
    out.put(static_cast<char>(mode));
    const std::string& body = mode == 0 ? *encoded : payload;
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    if (!out) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln-state-seeds OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const kiln::state::StateTarget t = kiln::fuzz::StateFuzzTarget();
  std::vector<std::pair<std::string, SessionState>> seeds;
  seeds.emplace_back("tokens-only", Base(20));
  SessionState with_logits = Base(12);
  AddKv(&with_logits, 12);
  for (int i = 0; i < t.n_vocab; ++i) with_logits.add_logits(static_cast<float>(i % 17) - 8.0f);
  seeds.emplace_back("kv-logits", with_logits);
  SessionState pending = Base(9);
  AddKv(&pending, 8);
  kiln::state::TokenLogprob* lp = pending.add_last_logprobs();
  lp->set_token(5);
  lp->set_logprob(-0.5f);
  seeds.emplace_back("kv-pending", pending);
  SessionState sliding = Base(24);
  AddKv(&sliding, 24, 10);
  seeds.emplace_back("kv-sliding", sliding);
  SessionState spec = Base(30);
  spec.set_n_computed(29);
  kiln::state::PassCostState* cost = spec.mutable_speculative()->mutable_cost();
  cost->set_t1(0.01);
  cost->set_slope(0.002);
  cost->set_n1(10);
  cost->set_n_wide(5);
  for (int w = 0; w <= t.max_timed_width; ++w) {
    cost->add_t_width(w == 3 ? 0.012 : 0.0);
    cost->add_seen_at(w == 3 ? 4 : 0);
  }
  kiln::state::NgramStrategyState ngram;
  ngram.set_max_ngram(3);
  ngram.set_min_ngram(1);
  ngram.set_max_draft(8);
  ngram.set_start_draft(4);
  ngram.set_max_skip(32);
  ngram.set_adaptive(true);
  ngram.set_fixed_pass_cost_beta(-1.0);
  for (int n = 0; n <= 3; ++n) {
    kiln::state::AcceptanceState* a = ngram.add_acceptance();
    a->set_s1(1.0 + n);
    a->set_f1(1.0);
    a->set_s(0.5);
    a->set_f(1.0);
  }
  for (int32_t tok : {10, 17, 24}) ngram.add_pending(tok);
  ngram.set_pending_len(28);
  ngram.set_pending_root(spec.tokens(27));
  ngram.set_pending_n(2);
  spec.mutable_speculative()->set_strategy("ngram");
  spec.mutable_speculative()->set_strategy_state(ngram.SerializeAsString());
  seeds.emplace_back("ngram", spec);
  for (const auto& [name, s] : seeds) {
    if (!Write(dir, name, s)) {
      std::fprintf(stderr, "kiln-state-seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
      return 1;
    }
  }
  std::printf("kiln-state-seeds: %zu seeds (x2) in %s\n", seeds.size(), dir.c_str());
  return 0;
}
