// spec_bench: speculative decoding vs plain decoding on the default model, side by side in one
// run. For temperature 0 and 0.8, on chat prompts and on copy-heavy prompts (quoting, code
// editing), it runs plain decoding (no strategy), the n-gram strategy with its cost-aware draft
// length (measured pass cost, docs/speculative.md), the n-gram strategy always drafting
// --ngram-max tokens (what the back-off buys), and a draft model cut from the target (its first
// --draft-layers layers, made with MakeDraftModel; cost-aware length), each --reps times (the
// strategies in turn within each repetition, so a drift in the machine's speed touches all), and
// prints decode tokens/s (generated tokens / wall time of the decoding steps, prefill excluded;
// per repetition over the whole prompt set) as median [min-max] and the speedup over plain; the
// same per second of process CPU time (all threads; steadier than wall time on a shared, loaded
// machine); the mean accepted draft tokens per step, the acceptance rate, target passes per
// generated token and the measured cost slope beta (a pass over w tokens costs 1 + beta (w - 1)
// one-token passes). The measured pass cost is carried across the prompts of a repetition (as a
// session carries it across turns). After each set, one line per prompt compares the cost-aware
// n-gram strategy with plain decoding on that prompt alone (the share of the answer that was
// accepted drafts shows how much of it copied the input).
//
//   spec_bench [--model PATH] [--threads N] [--tokens N] [--reps N] [--draft-layers K]
//              [--draft-max K] [--ngram-max K] [--ngram-min N] [--prompts N (per set, at most 4)]
//              [--temp T (only this temperature)] [--set chat|copy (only this set)]
//              [--medusa HEAD.gguf (adds the Medusa strategy with this head file)]
//              [--eagle HEAD.gguf (adds the EAGLE strategy with this head file; its tree shape
//              and size chosen per step from the measured costs; repeat the flag for more heads
//              side by side: eagle, eagle2, ..)]
//              [--eagle-shape TOP_K,DEPTH (fixes the EAGLE trees' top_k and depth; 0,0: chosen)]
//              [--medusa-nodes N,M,.. (one Medusa strategy per count, each verifying the first
//              N nodes of the file's tree, side by side: does a smaller tree win?)]
//              [--only-medusa (plain and the head strategies, medusa and eagle, only)]
//              [--typical (adds medusa-typ / eagle-typ rows: the same heads with the lossy
//               typical acceptance; at temperature 0 they verify greedily, as the exact rows)]
// With --medusa it first prints the cost of one Medusa proposal (the heads and their LM head,
// full tree, median of 200 calls on a fixed feature) against one plain decoding step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/common/strings.h"
#include "lib/model/model.h"
#include "lib/session/session.h"
#include "lib/spec/draft_model_strategy.h"
#include "lib/spec/eagle_strategy.h"
#include "lib/spec/make_draft.h"
#include "lib/spec/medusa_strategy.h"
#include "lib/spec/ngram_strategy.h"
#include "lib/spec/spec_generate.h"
#include "lib/tokenizer/tokenizer.h"

namespace {

using namespace kiln;        // NOLINT
using namespace kiln::spec;  // NOLINT

const char* const kChatPrompts[] = {
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for learning a new language.",
    "Explain what a hash table is in two sentences.",
    "Write a short story about a robot who learns to paint.",
};

const char* const kCopyPrompts[] = {
    "Repeat this paragraph exactly: The committee met on Tuesday to review the budget. After a "
    "long discussion, the members agreed to increase funding for the library, reduce spending on "
    "travel, and postpone the new parking lot until next year.",
    "Rename the function compute to compute_total in this code and print the whole code:\n"
    "def compute(items):\n    total = 0\n    for item in items:\n        total += item.price * "
    "item.quantity\n    return total\n\nprint(compute(cart))",
    "Fix the spelling mistakes and write the text again: The quick brwn fox jumpd over the lazy "
    "dog. The dog did not notise, becuase it was sleeping in the warm afternon sun.",
    "Copy this list, one item per line: apples, bananas, cherries, dates, elderberries, figs, "
    "grapes, honeydew, kiwis, lemons.",
};

std::string ChatPrompt(const std::string& user) {
  return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

struct Row {
  std::vector<double> tok_s;      // per repetition, wall time
  std::vector<double> tok_cpu_s;  // per repetition, process CPU time
  int64_t steps = 0, accepted = 0, generated = 0, drafted = 0;
};

// One prompt's totals over the repetitions (for the per-prompt lines).
struct PromptTotals {
  int64_t generated = 0, accepted = 0;
  double seconds = 0.0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  if (const char* home = std::getenv("HOME")) {
    model_path = std::string(home) + "/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  int threads = 2, tokens = 64, reps = 3, draft_layers = 4, draft_max = 4, ngram_max = 8,
      n_prompts = 4, ngram_min = NgramParams().min_ngram;
  std::vector<float> temps = {0.0f, 0.8f};
  std::vector<int> sets = {0, 1};  // chat, copy
  std::string medusa_path;
  std::vector<std::string> eagle_paths;
  int32_t eagle_top_k = 0, eagle_depth = 0;
  std::vector<int32_t> medusa_nodes;  // empty: one Medusa strategy with the file's whole tree
  bool only_medusa = false;
  bool typical = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: spec_bench [--model PATH] [--threads N (2)] [--tokens N (64)] [--reps N (3)]\n"
          "                  [--draft-layers K (4)] [--draft-max K (4)] [--ngram-max K (8)]\n"
          "                  [--ngram-min N (shortest suffix, 1)]\n"
          "                  [--prompts N (4, per set, at most 4)] [--temp T] [--set chat|copy]\n"
          "                  [--medusa HEAD.gguf] [--medusa-nodes N,M,..] [--eagle HEAD.gguf]..\n"
          "                  [--eagle-shape TOP_K,DEPTH (0,0)] [--only-medusa] [--typical]\n"
          "Decode tokens/s of plain decoding, n-gram (cost-aware and always-max), and a draft\n"
          "model cut from the target, at temperature 0 and 0.8 on chat and copy-heavy prompts.\n");
      return 0;
    }
    if (a == "--only-medusa" || a == "--typical") {  // the flags without a value
      (a == "--typical" ? typical : only_medusa) = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", argv[i]);
      return 2;
    }
    const char* v = argv[i + 1];
    if (a == "--model")
      model_path = v;
    else if (a == "--threads")
      threads = std::atoi(v);
    else if (a == "--tokens")
      tokens = std::atoi(v);
    else if (a == "--reps")
      reps = std::atoi(v);
    else if (a == "--draft-layers")
      draft_layers = std::atoi(v);
    else if (a == "--draft-max")
      draft_max = std::atoi(v);
    else if (a == "--ngram-max")
      ngram_max = std::atoi(v);
    else if (a == "--ngram-min")
      ngram_min = std::atoi(v);
    else if (a == "--medusa")
      medusa_path = v;
    else if (a == "--eagle")
      eagle_paths.push_back(v);
    else if (a == "--eagle-shape") {
      if (std::sscanf(v, "%d,%d", &eagle_top_k, &eagle_depth) != 2) {
        std::fprintf(stderr, "--eagle-shape: TOP_K,DEPTH: %s\n", v);
        return 2;
      }
    } else if (a == "--medusa-nodes") {
      for (const char* c = v; *c != '\0';) {
        char* end = nullptr;
        const long n = std::strtol(c, &end, 10);
        if (end == c || n < 1 || n > 64 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--medusa-nodes: node counts in [1, 64], comma-separated: %s\n", v);
          return 2;
        }
        medusa_nodes.push_back(static_cast<int32_t>(n));
        c = *end == ',' ? end + 1 : end;
      }
    } else if (a == "--prompts")
      n_prompts = std::atoi(v);
    else if (a == "--temp")
      temps = {static_cast<float>(std::atof(v))};
    else if (a == "--set") {
      if (std::string_view(v) != "chat" && std::string_view(v) != "copy") {
        std::fprintf(stderr, "--set must be chat or copy, got %s\n", v);
        return 2;
      }
      sets = {std::string_view(v) == "chat" ? 0 : 1};
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  ModelLoadOptions load;
  load.path = model_path;
  auto model = Model::Load(load);
  if (!model.ok()) {
    std::fprintf(stderr, "load %s: %s\n", model_path.c_str(),
                 std::string(model.status().message()).c_str());
    return 1;
  }
  (*model)->WaitUntilPrepared();  // timed runs on the prepared copies (engine_bench.cc)
  EngineOptions eo;
  eo.n_threads = threads;
  eo.n_ctx = 2048;
  auto engine = Engine::Create(**model, eo);
  if (!engine.ok()) return 1;
  const std::string draft_path =
      "/tmp/kiln_spec_bench_draft" + std::to_string(draft_layers) + ".gguf";
  if (absl::Status st = MakeDraftModel(model_path, draft_path, draft_layers); !st.ok()) {
    std::fprintf(stderr, "mkdraft: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  NgramParams np;
  np.max_draft = ngram_max;
  np.min_ngram = ngram_min;
  np.start_draft = std::min(np.start_draft, ngram_max);
  auto ngram = NgramStrategy::Create(np);
  NgramParams always = np;
  always.adaptive = false;
  auto ngram_always = NgramStrategy::Create(always);
  DraftModelParams dp;
  dp.n_threads = threads;
  dp.max_draft = draft_max;
  auto draft = DraftModelStrategy::Load(draft_path, (*model)->hparams().n_vocab, dp);
  for (const absl::Status& st : {ngram.status(), ngram_always.status(), draft.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "strategy: %s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  struct Named {
    const char* name;
    Strategy* strategy;
  };
  std::vector<Named> strategies = {{"plain", nullptr}};
  if (!only_medusa) {
    strategies.push_back({"ngram", ngram->get()});
    strategies.push_back({"ngram-max", ngram_always->get()});
    strategies.push_back({"draft", draft->get()});
  }
  std::unique_ptr<MedusaStrategy> medusa;
  std::vector<std::unique_ptr<MedusaStrategy>> medusa_cut;  // --medusa-nodes
  std::vector<std::string> medusa_names;                    // their row names, "medusa/N"
  if (!medusa_path.empty()) {
    MedusaParams mp;
    auto loaded = MedusaStrategy::Load(medusa_path, **model, mp);
    if (!loaded.ok()) {
      std::fprintf(stderr, "medusa: %s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    medusa = std::move(*loaded);
    medusa_names.reserve(medusa_nodes.size());  // the rows keep pointers to the names
    for (int32_t n : medusa_nodes) {
      MedusaParams cut;
      cut.max_draft = n;
      auto s =
          MedusaStrategy::Create(std::make_shared<const MedusaHead>(medusa->head()), **model, cut);
      if (!s.ok()) {
        std::fprintf(stderr, "medusa: %s\n", std::string(s.status().message()).c_str());
        return 1;
      }
      medusa_cut.push_back(std::move(*s));
      medusa_names.push_back("medusa/" + std::to_string(n));
      strategies.push_back({medusa_names.back().c_str(), medusa_cut.back().get()});
    }
    if (medusa_nodes.empty()) strategies.push_back({"medusa", medusa.get()});
    if (typical) {
      MedusaParams lossy;
      lossy.typical = sample::TypicalAcceptance{};
      auto s = MedusaStrategy::Create(std::make_shared<const MedusaHead>(medusa->head()), **model,
                                      lossy);
      if (!s.ok()) {
        std::fprintf(stderr, "medusa: %s\n", std::string(s.status().message()).c_str());
        return 1;
      }
      medusa_cut.push_back(std::move(*s));
      strategies.push_back({"medusa-typ", medusa_cut.back().get()});
    }
    // Proposal cost: the full tree from a fixed feature (the heads' cost does not depend on it).
    const int64_t d = (*model)->hparams().n_embd;
    const std::vector<float> feature(d, 0.5f);
    const std::vector<int32_t> context(8, 1);
    std::vector<double> ms;
    DraftTree tree;
    for (int i = 0; i < 200; ++i) {
      medusa->ObserveTargetFeatures(7, 8, feature, d);
      const auto t0 = std::chrono::steady_clock::now();
      if (!medusa->Propose(context, 64, {}, &tree).ok()) return 1;
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    medusa->Reset();
    const std::vector<int32_t> warm =
        *(*model)->tokenizer().Encode(ChatPrompt(kChatPrompts[0]), true, true);
    auto plain = GenerateSpeculative(**engine, warm, sample::SamplerParams{}, 1, nullptr, 16);
    const double step_ms =
        plain.ok() && plain->metrics.generated > 0
            ? 1000.0 * plain->decode_seconds / static_cast<double>(plain->metrics.generated)
            : 0.0;
    const MedusaHead& h = medusa->head();
    std::printf(
        "medusa proposal: %.2f ms (median of 200; %d nodes, %d heads, vocabulary %lld), plain "
        "step %.2f ms: %.2f of a step\n",
        Median(ms), tree.size(), h.tree.MaxDepth(tree.size()),
        static_cast<long long>(h.vocab_ids.empty() ? (*model)->hparams().n_vocab
                                                   : static_cast<int64_t>(h.vocab_ids.size())),
        step_ms, step_ms > 0 ? Median(ms) / step_ms : 0.0);
  }
  // One EagleStrategy per --eagle file, and with --typical each again with the lossy rule.
  std::vector<std::unique_ptr<EagleStrategy>> eagles, eagles_typical;
  std::vector<std::string> eagle_names;
  eagle_names.reserve(2 * eagle_paths.size());  // strategies keeps pointers into the names
  auto load_eagle = [&](const std::string& path,
                        std::optional<sample::TypicalAcceptance> rule) -> EagleStrategy* {
    EagleParams ep;
    ep.n_threads = threads;
    ep.top_k = eagle_top_k;
    ep.max_depth = eagle_depth;
    ep.typical = rule;
    auto loaded = EagleStrategy::Load(path, **model, ep);
    if (!loaded.ok()) {
      std::fprintf(stderr, "eagle: %s\n", std::string(loaded.status().message()).c_str());
      return nullptr;
    }
    auto& list = rule ? eagles_typical : eagles;
    list.push_back(std::move(*loaded));
    return list.back().get();
  };
  for (const std::string& path : eagle_paths) {
    EagleStrategy* eagle = load_eagle(path, std::nullopt);
    if (eagle == nullptr) return 1;
    const std::shared_ptr<const ReducedLmHead>& vocab = eagle->head().draft_vocab;
    // "eagle1" / "eagle3" by the head's kind, "#N" (the file's place) after a repeated kind.
    std::string name = eagle->head().eagle3() ? "eagle3" : "eagle1";
    if (std::find(eagle_names.begin(), eagle_names.end(), name) != eagle_names.end()) {
      name = kiln::StrCat(name, "#", eagles.size());
    }
    eagle_names.push_back(name);
    std::printf("%s: %s, draft vocabulary %lld\n", eagle_names.back().c_str(), path.c_str(),
                static_cast<long long>(vocab ? vocab->ids.size() : (*model)->hparams().n_vocab));
    strategies.push_back({eagle_names.back().c_str(), eagle});
  }
  for (size_t e = 0; typical && e < eagle_paths.size(); ++e) {
    EagleStrategy* eagle = load_eagle(eagle_paths[e], sample::TypicalAcceptance{});
    if (eagle == nullptr) return 1;
    eagle_names.push_back(eagle_names[e] + "-typ");
    strategies.push_back({eagle_names.back().c_str(), eagle});
  }
  std::printf(
      "spec_bench: %s, %d threads, %d tokens, %d reps, ngram max %d, draft %d layers max %d\n",
      model_path.c_str(), threads, tokens, reps, ngram_max, draft_layers, draft_max);
  std::printf("%-5s %-5s %-9s %24s %8s %24s %8s %9s %9s %11s %6s\n", "temp", "set", "strat",
              "wall tok/s med [min-max]", "speedup", "tok/cpu-s med [min-max]", "speedup",
              "acc/step", "acc rate", "passes/tok", "beta");
  for (float temp : temps) {
    sample::SamplerParams sp;
    sp.temperature = temp;
    for (int set : sets) {
      std::vector<std::vector<int32_t>> prompts;
      const auto& texts = set == 0 ? kChatPrompts : kCopyPrompts;
      for (const char* t : texts) {
        if (static_cast<int>(prompts.size()) >= n_prompts) break;
        prompts.push_back(*(*model)->tokenizer().Encode(ChatPrompt(t), true, true));
      }
      double plain_median = 0.0, plain_cpu_median = 0.0;
      std::vector<PromptTotals> plain_prompts(prompts.size()), ngram_prompts(prompts.size());
      // Repetitions outer, strategies inner: a drift in the machine's speed (a loaded
      // neighbour, frequency) then touches every strategy alike instead of whichever ran last.
      const size_t kStrategies = strategies.size();
      std::vector<Row> rows(kStrategies);
      std::vector<std::vector<double>> betas(kStrategies);
      for (int r = 0; r < reps; ++r) {
        for (size_t si = 0; si < kStrategies; ++si) {
          const Named& s = strategies[si];
          Row& row = rows[si];
          PassCostModel cost;  // carried across the prompt set, as a session would
          int64_t gen = 0;
          double secs = 0.0, cpu_secs = 0.0;
          for (size_t p = 0; p < prompts.size(); ++p) {
            auto res = GenerateSpeculative(**engine, prompts[p], sp, 1000 + r * 10 + p, s.strategy,
                                           tokens, &cost);
            if (!res.ok()) {
              std::fprintf(stderr, "generate: %s\n", std::string(res.status().message()).c_str());
              return 1;
            }
            gen += res->metrics.generated;
            secs += res->decode_seconds;
            if (s.strategy == nullptr || s.strategy == ngram->get()) {
              PromptTotals& pt = (s.strategy == nullptr ? plain_prompts : ngram_prompts)[p];
              pt.generated += res->metrics.generated;
              pt.accepted += res->metrics.accepted;
              pt.seconds += res->decode_seconds;
            }
            cpu_secs += res->decode_cpu_seconds;
            row.steps += res->metrics.steps;
            row.accepted += res->metrics.accepted;
            row.drafted += res->metrics.drafted;
            row.generated += res->metrics.generated;
          }
          if (cost.wide_observations() > 0) betas[si].push_back(cost.Beta());
          row.tok_s.push_back(static_cast<double>(gen) / secs);
          row.tok_cpu_s.push_back(static_cast<double>(gen) / cpu_secs);
        }
      }
      for (size_t si = 0; si < kStrategies; ++si) {
        const Named& s = strategies[si];
        const Row& row = rows[si];
        const double med = Median(row.tok_s);
        const double cpu_med = Median(row.tok_cpu_s);
        if (s.strategy == nullptr) {
          plain_median = med;
          plain_cpu_median = cpu_med;
        }
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.1f [%.1f-%.1f]", med,
                      *std::min_element(row.tok_s.begin(), row.tok_s.end()),
                      *std::max_element(row.tok_s.begin(), row.tok_s.end()));
        char cpu_buf[64];
        std::snprintf(cpu_buf, sizeof(cpu_buf), "%.1f [%.1f-%.1f]", cpu_med,
                      *std::min_element(row.tok_cpu_s.begin(), row.tok_cpu_s.end()),
                      *std::max_element(row.tok_cpu_s.begin(), row.tok_cpu_s.end()));
        char beta_buf[16] = "-";
        if (!betas[si].empty()) {
          std::snprintf(beta_buf, sizeof(beta_buf), "%.2f", Median(betas[si]));
        }
        std::printf("%-5.1f %-5s %-9s %24s %7.2fx %24s %7.2fx %9.2f %9.2f %11.3f %6s\n", temp,
                    set == 0 ? "chat" : "copy", s.name, buf, med / plain_median, cpu_buf,
                    cpu_med / plain_cpu_median,
                    row.steps ? static_cast<double>(row.accepted) / row.steps : 0.0,
                    row.drafted ? static_cast<double>(row.accepted) / row.drafted : 0.0,
                    row.generated ? static_cast<double>(row.steps) / row.generated : 0.0, beta_buf);
        std::fflush(stdout);
      }
      // Per prompt, the cost-aware n-gram strategy against plain decoding (wall time summed over
      // the repetitions): how much of each answer was accepted drafts, and what that bought.
      for (size_t p = 0; p < prompts.size(); ++p) {
        const PromptTotals& pl = plain_prompts[p];
        const PromptTotals& ng = ngram_prompts[p];
        if (pl.seconds <= 0.0 || ng.seconds <= 0.0 || ng.generated == 0) continue;
        const double plain_tps = pl.generated / pl.seconds, ngram_tps = ng.generated / ng.seconds;
        std::printf(
            "      prompt %zu: %lld tokens/run, %4.1f%% accepted drafts, plain %.1f tok/s, "
            "ngram %.1f tok/s, %.2fx\n",
            p, static_cast<long long>(ng.generated / reps),
            100.0 * static_cast<double>(ng.accepted) / ng.generated, plain_tps, ngram_tps,
            ngram_tps / plain_tps);
      }
    }
  }
  // What one head pass costs (the automatic tree's draft-step cost, over a plain step's time).
  for (size_t e = 0; e < eagles.size(); ++e) {
    std::printf("%s: head pass %.2f ms (moving average of the last ones), last tree depth %d\n",
                eagle_names[e].c_str(), 1000.0 * eagles[e]->head_pass_seconds(),
                eagles[e]->last_depth());
  }
  return 0;
}
