// libFuzzer target: read arbitrary bytes as a saved session state (lib/session/session_state.h)
// against a fixed target (a small model's dimensions), then use what Decode accepted the way
// Session::LoadState does: walk the K/V tiles, the logits and the sampler fields, restore the
// pass-cost model and query it, and load an n-gram strategy state into a strategy and let it
// propose on the restored tokens. Decode's promise is that a state it accepts is safe to apply;
// a crash or sanitizer report here breaks it.
//
// The first input byte picks the mode: even, the rest of the input is the whole state; odd, the
// rest is wrapped as the payload of a valid envelope (right magic, version and CRC-32C), so that
// the fuzzer reaches the payload checks behind the checksum instead of failing it every time.
// Build: tests/fuzz/run_fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "lib/engine/draft_policy.h"
#include "lib/session/session_state.h"
#include "lib/spec/ngram_strategy.h"
#include "tests/fuzz/state_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::state::StateTarget target = kiln::fuzz::StateFuzzTarget();
  if (size == 0) return 0;
  std::string bytes;
  if ((data[0] & 1) != 0) {
    kiln::state::SessionStateFile file;
    file.set_magic(std::string(kiln::state::kMagic));
    file.set_format_version(kiln::state::kFormatVersion);
    file.set_payload(reinterpret_cast<const char*>(data + 1), size - 1);
    file.set_payload_crc32c(kiln::state::Crc32c(data + 1, size - 1));
    bytes = file.SerializeAsString();
  } else {
    bytes.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  kiln::state::SessionState s;
  const absl::Status st = kiln::state::Decode(bytes, target, &s);
  if (!st.ok()) {
    // Every error must carry a message naming what was wrong.
    if (st.message().empty()) __builtin_trap();
    return 0;
  }
  size_t sink = 0;
  // What LoadState copies: every tile of a global layer is n_computed rows, of a sliding layer
  // the rows from sliding_first_row on; the logits n_vocab or none.
  if (s.has_kv()) {
    const int tiles_per_layer =
        s.kv().tiles_size() / static_cast<int>(target.kv_sliding_layers.size());
    for (int i = 0; i < s.kv().tiles_size(); ++i) {
      const std::string& tile = s.kv().tiles(i);
      const bool sliding = target.kv_sliding_layers[i / tiles_per_layer] != 0;
      const uint32_t first = sliding ? s.kv().sliding_first_row() : 0;
      if (first > static_cast<uint32_t>(s.n_computed())) __builtin_trap();
      const size_t rows = static_cast<size_t>(s.n_computed()) - first;
      if (tile.size() != rows * target.kv_row_bytes) __builtin_trap();
      if (!tile.empty())
        sink += static_cast<uint8_t>(tile.front()) + static_cast<uint8_t>(tile.back());
    }
  }
  if (s.logits_size() != 0 && s.logits_size() != target.n_vocab) __builtin_trap();
  for (int32_t t : s.tokens()) {
    if (t < 0 || t >= target.n_vocab) __builtin_trap();
  }
  if (s.rng_state_size() != 4) __builtin_trap();
  if (s.has_speculative() && s.speculative().has_cost()) {
    const kiln::state::PassCostState& c = s.speculative().cost();
    kiln::spec::PassCostModel::Snapshot snap;
    snap.t1 = c.t1();
    snap.slope = c.slope();
    for (size_t i = 0; i < snap.t_width.size(); ++i) {
      snap.t_width[i] = c.t_width(static_cast<int>(i));
      snap.seen_at[i] = c.seen_at(static_cast<int>(i));
    }
    snap.n1 = c.n1();
    snap.n_wide = c.n_wide();
    snap.pinned = c.pinned();
    snap.pinned_beta = c.pinned_beta();
    kiln::spec::PassCostModel cost;
    cost.Restore(snap);
    for (int32_t w = 0; w <= kiln::spec::PassCostModel::kMaxTimedWidth + 2; ++w) {
      sink += cost.RelativeCost(w) > 1.0;
    }
  }
  if (s.has_speculative() && s.speculative().strategy() == "ngram") {
    // A strategy with the saved parameters (when they are valid ones), loaded and proposing.
    kiln::state::NgramStrategyState saved;
    if (saved.ParseFromString(s.speculative().strategy_state())) {
      kiln::spec::NgramParams p;
      p.max_ngram = saved.max_ngram();
      p.min_ngram = saved.min_ngram();
      p.max_draft = saved.max_draft();
      p.start_draft = saved.start_draft();
      p.max_skip = saved.max_skip();
      p.adaptive = saved.adaptive();
      p.fixed_pass_cost_beta = saved.fixed_pass_cost_beta();
      auto ngram = kiln::spec::NgramStrategy::Create(p);
      if (ngram.ok() && (*ngram)->LoadState(s.speculative().strategy_state()).ok() &&
          s.tokens_size() > 0) {
        const std::vector<int32_t> tokens(s.tokens().begin(), s.tokens().end());
        kiln::sample::SamplerParams sampler;
        kiln::spec::ProposeContext ctx;
        ctx.sampler_params = &sampler;
        kiln::spec::DraftTree tree;
        if ((*ngram)->Propose(tokens, p.max_draft, ctx, &tree).ok()) sink += tree.size();
      }
    }
  }
  volatile size_t keep = sink;
  (void)keep;
  return 0;
}
