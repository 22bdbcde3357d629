#include "lib/tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cpu/per_thread.h"
#include "lib/common/status.h"
#include "lib/tokenizer/pre_tokenizer.h"
#include "lib/tokenizer/unicode.h"

namespace kiln {

// Work buffers reused across Encode calls on the same thread.
struct Tokenizer::Scratch {
  std::vector<Segment> segments;
  std::vector<uint8_t> covered;  // per text byte: already claimed by a special token
  std::vector<pretok::Unit> units;

  struct Symbol {
    int32_t sym;     // BPE: symbol id (-1 unknown byte, -2 merged away)
    int32_t prev;    // index of the previous live symbol, -1 at the start
    int32_t next;    // index of the next live symbol, -1 at the end
    uint32_t begin;  // SPM: byte range in `escaped`
    uint32_t len;
  };
  std::vector<Symbol> symbols;

  struct BpeCandidate {
    uint64_t key;  // rank << 32 | left index: smaller pops first
    int32_t right;
    int32_t left_sym;
    int32_t right_sym;
    int32_t result;
  };
  std::vector<BpeCandidate> bpe_heap;

  struct SpmCandidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size;
  };
  std::vector<SpmCandidate> spm_heap;
  std::string escaped;
  std::string replaced;  // BPE: a text segment after unicode::ReplaceInvalidUtf8

  // BPE word cache: word bytes -> [offset, length) in cached_ids. Valid for one Tokenizer
  // (cache_owner); cleared when it grows past kMaxCachedWords.
  static constexpr size_t kMaxCachedWords = 1 << 16;
  static constexpr size_t kMinCachedLength = 2;
  static constexpr size_t kMaxCachedLength = 48;
  uint64_t cache_owner = 0;
  absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> word_cache;
  std::vector<int32_t> cached_ids;

  // Drops very large buffers after a call so one huge input does not pin memory per thread.
  void Trim() {
    constexpr size_t kKeep = 1 << 20;
    if (units.capacity() > kKeep) std::vector<pretok::Unit>().swap(units);
    if (covered.capacity() > kKeep) std::vector<uint8_t>().swap(covered);
    if (symbols.capacity() > kKeep) std::vector<Symbol>().swap(symbols);
    if (bpe_heap.capacity() > kKeep) std::vector<BpeCandidate>().swap(bpe_heap);
    if (spm_heap.capacity() > kKeep) std::vector<SpmCandidate>().swap(spm_heap);
    if (escaped.capacity() > kKeep) std::string().swap(escaped);
    if (replaced.capacity() > kKeep) std::string().swap(replaced);
    if (cached_ids.capacity() > kKeep) {
      std::vector<int32_t>().swap(cached_ids);
      word_cache.clear();
    }
  }
};

namespace {

Tokenizer::Scratch& ThreadScratch() { return kernels::PerThread<Tokenizer::Scratch>(); }

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";     // U+2581 "▁"
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Inverse GPT-2 byte mapping of `text`; false if some code point is not a mapped byte (then
// *out holds the bytes decoded so far followed by the rest verbatim).
bool ByteLevelDecode(std::string_view text, std::string* out) {
  bool ok = true;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const uint32_t cp = unicode::DecodeUtf8(text, &pos);
    const int byte = cp >= unicode::kInvalidBase ? -1 : unicode::ByteFromUnicode(cp);
    if (byte < 0) {
      ok = false;
      out->append(text.substr(start, pos - start));
    } else {
      out->push_back(static_cast<char>(byte));
    }
  }
  return ok;
}

// "<0xAB>" -> 0xAB, or -1.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Texts llama.cpp treats as end of turn (eot fallback) / end of generation.
constexpr std::string_view kEotTexts[] = {"<|eot_id|>",    "<|im_end|>",        "<|end|>",
                                          "<end_of_turn>", "<|endoftext|>",     "<EOT>",
                                          "_<EOT>",        "<end_of_utterance>"};
constexpr std::string_view kEogTexts[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>",
                                          "<|return|>",    "<|call|>",        "<end_of_turn>",
                                          "<|endoftext|>", "<|eom_id|>",      "<EOT>",
                                          "_<EOT>",        "<|end_of_text|>", "<end_of_utterance>"};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(Vocab vocab) {
  KILN_RETURN_IF_ERROR(vocab.Validate());
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab)));
  static std::atomic<uint64_t> next_instance_id{1};
  t->instance_id_ = next_instance_id.fetch_add(1);
  KILN_RETURN_IF_ERROR(t->Build());
  return t;
}

absl::Status Tokenizer::Build() {
  const int32_t n = vocab_.size();
  types_.resize(n);
  for (int32_t i = 0; i < n; ++i) types_[i] = vocab_.type(i);

  // End of generation (llama.cpp): eos, eot, eom and tokens with an end-of-turn text, which are
  // also forced to CONTROL. eot falls back to the first kEotTexts entry present.
  eog_.assign(n, 0);
  if (vocab_.eot < 0) {
    for (std::string_view want : kEotTexts) {
      for (int32_t i = 0; i < n && vocab_.eot < 0; ++i) {
        if (vocab_.tokens[i] == want) vocab_.eot = i;
      }
      if (vocab_.eot >= 0) break;
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    for (std::string_view t : kEogTexts) {
      if (vocab_.tokens[i] == t) {
        eog_[i] = 1;
        types_[i] = TokenType::kControl;
      }
    }
  }
  for (int32_t id : {vocab_.eos, vocab_.eot, vocab_.eom}) {
    if (id >= 0) eog_[id] = 1;
  }

  // Special-token candidates, longest text first (ties: lower id first).
  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = types_[i];
    if ((t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) &&
        !vocab_.tokens[i].empty()) {
      specials_.push_back(i);
      has_user_defined_ = has_user_defined_ || t == TokenType::kUserDefined;
      special_first_byte_[static_cast<uint8_t>(vocab_.tokens[i][0])] = true;
    }
  }
  std::stable_sort(specials_.begin(), specials_.end(), [&](int32_t a, int32_t b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });

  // Pieces.
  piece_offsets_.resize(n + 1);
  std::string scratch;
  for (int32_t i = 0; i < n; ++i) {
    piece_offsets_[i] = static_cast<uint32_t>(pieces_.size());
    const std::string& text = vocab_.tokens[i];
    switch (types_[i]) {
      case TokenType::kNormal:
        if (vocab_.model == VocabModel::kBpe) {
          scratch.clear();
          ByteLevelDecode(text, &scratch);
          pieces_ += scratch;
        } else {
          for (size_t p = 0; p < text.size();) {
            if (text.compare(p, kSpmSpace.size(), kSpmSpace) == 0) {
              pieces_.push_back(' ');
              p += kSpmSpace.size();
            } else {
              pieces_.push_back(text[p++]);
            }
          }
        }
        break;
      case TokenType::kByte: {
        const int byte = ParseByteToken(text);
        if (byte >= 0) {
          pieces_.push_back(static_cast<char>(byte));
        } else {
          pieces_ += text;
        }
        break;
      }
      case TokenType::kControl:
      case TokenType::kUnknown:
      case TokenType::kUserDefined:
        pieces_ += text;
        break;
      case TokenType::kUnused:
      case TokenType::kUndefined:
        break;
    }
    if (pieces_.size() > UINT32_MAX) {
      return absl::InvalidArgumentError("vocab: decoded token texts exceed 4 GiB");
    }
  }
  piece_offsets_[n] = static_cast<uint32_t>(pieces_.size());

  return vocab_.model == VocabModel::kBpe ? BuildBpe() : BuildSpm();
}

absl::Status Tokenizer::BuildBpe() {
  const int32_t n = vocab_.size();
  ignore_merges_ = vocab_.pre == PreTokenizer::kLlama3;
  // Raw-byte keys of every token whose text is byte-level encoded. The arena is complete before
  // any view into it is taken.
  std::vector<std::pair<uint32_t, uint32_t>> key_ranges(n, {0, 0});
  std::vector<uint8_t> has_key(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    std::string key;
    if (vocab_.tokens[i].empty() || !ByteLevelDecode(vocab_.tokens[i], &key)) continue;
    key_ranges[i] = {static_cast<uint32_t>(bpe_keys_.size()), static_cast<uint32_t>(key.size())};
    has_key[i] = 1;
    bpe_keys_ += key;
  }
  bpe_symbol_of_.reserve(n + vocab_.merges.size() / 8);
  for (int32_t i = 0; i < n; ++i) {
    if (!has_key[i]) continue;
    // Later duplicates win, like llama.cpp's token_to_id.
    bpe_symbol_of_[std::string_view(bpe_keys_).substr(key_ranges[i].first, key_ranges[i].second)] =
        i;
  }
  auto intern = [&](std::string bytes) -> int32_t {
    auto it = bpe_symbol_of_.find(bytes);
    if (it != bpe_symbol_of_.end()) return it->second;
    const auto id = static_cast<int32_t>(n + extra_symbols_.size());
    extra_symbols_.push_back(std::make_unique<std::string>(std::move(bytes)));
    bpe_symbol_of_.emplace(*extra_symbols_.back(), id);
    return id;
  };
  merges_.reserve(vocab_.merges.size());
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    std::string left, right;
    if (!ByteLevelDecode(vocab_.merges[r].first, &left) ||
        !ByteLevelDecode(vocab_.merges[r].second, &right)) {
      continue;  // can never match a byte-level symbol
    }
    const int32_t l = intern(left);
    const int32_t rt = intern(right);
    const int32_t result = intern(left + right);
    const uint64_t key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(rt);
    merges_.emplace(key, Merge{static_cast<int32_t>(r), result});  // first (best) rank wins
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    auto it = bpe_symbol_of_.find(std::string_view(&c, 1));
    byte_symbol_[b] = it == bpe_symbol_of_.end() ? -1 : it->second;
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::BuildSpm() {
  const int32_t n = vocab_.size();
  spm_token_of_.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    if (!vocab_.tokens[i].empty()) spm_token_of_[vocab_.tokens[i]] = i;
  }
  static const char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    auto it = spm_token_of_.find(std::string_view(name, 6));
    if (it == spm_token_of_.end()) {
      const char c = static_cast<char>(b);
      it = spm_token_of_.find(std::string_view(&c, 1));
    }
    byte_token_[b] = it == spm_token_of_.end() ? -1 : it->second;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Encode

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special,
                                                       bool parse_special) const {
  std::vector<int32_t> out;
  KILN_RETURN_IF_ERROR(EncodeTo(text, add_special, parse_special, &out));
  return out;
}

absl::Status Tokenizer::EncodeTo(std::string_view text, bool add_special, bool parse_special,
                                 std::vector<int32_t>* out) const {
  if (text.size() >= UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Encode: text of ", text.size(), " bytes exceeds the 4 GiB limit"));
  }
  Scratch& s = ThreadScratch();
  if (add_special && vocab_.add_bos) out->push_back(vocab_.bos);
  Partition(text, parse_special, s);
  absl::Status status;
  bool prev_special = true;  // SPM: a space prefix goes at the text start and after specials
  for (const Segment& seg : s.segments) {
    if (seg.token >= 0) {
      out->push_back(seg.token);
      prev_special = true;
      continue;
    }
    const std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    if (vocab_.model == VocabModel::kBpe) {
      // llama.cpp's text: each invalid byte becomes U+FFFD, overlong forms their shortest form.
      std::string_view bpe_text = piece;
      if (unicode::ReplaceInvalidUtf8(piece, &s.replaced)) {
        if (s.replaced.size() >= UINT32_MAX) {
          status = absl::InvalidArgumentError(absl::StrCat(
              "Encode: text of ", text.size(), " bytes exceeds the 4 GiB limit once its ",
              "invalid UTF-8 bytes are replaced by U+FFFD"));
          break;
        }
        bpe_text = s.replaced;
      }
      EncodeBpeText(bpe_text, s, out);
    } else {
      status = EncodeSpmText(piece, vocab_.add_space_prefix && prev_special, s, out);
      if (!status.ok()) break;
    }
    prev_special = false;
  }
  if (status.ok() && add_special && vocab_.add_eos) out->push_back(vocab_.eos);
  s.Trim();
  return status;
}

void Tokenizer::Partition(std::string_view text, bool parse_special, Scratch& s) const {
  s.segments.clear();
  if (text.empty()) return;
  // Candidate occurrences of special texts: (order in specials_, byte position).
  struct Hit {
    uint32_t special_index;
    uint32_t pos;
  };
  std::vector<Hit>& hits = kernels::PerThread<std::vector<Hit>>();
  hits.clear();
  if (!specials_.empty() && (parse_special || has_user_defined_)) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    for (size_t pos = 0; pos < text.size(); ++pos) {
      if (!special_first_byte_[p[pos]]) continue;
      for (size_t k = 0; k < specials_.size(); ++k) {
        const int32_t id = specials_[k];
        if (!parse_special && types_[id] != TokenType::kUserDefined) continue;
        const std::string& st = vocab_.tokens[id];
        if (text.size() - pos >= st.size() && std::memcmp(p + pos, st.data(), st.size()) == 0) {
          hits.push_back({static_cast<uint32_t>(k), static_cast<uint32_t>(pos)});
        }
      }
    }
  }
  if (hits.empty()) {
    s.segments.push_back({0, text.size(), -1});
    return;
  }
  // llama.cpp's order: each special text in turn (longest first) claims its leftmost
  // non-overlapping occurrences inside the text not yet claimed.
  std::stable_sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) {
    return a.special_index != b.special_index ? a.special_index < b.special_index : a.pos < b.pos;
  });
  s.covered.assign(text.size(), 0);
  struct Claim {
    size_t pos;
    size_t len;
    int32_t token;
  };
  std::vector<Claim>& claims = kernels::PerThread<std::vector<Claim>>();
  claims.clear();
  uint32_t current = UINT32_MAX;
  size_t last_end = 0;
  for (const Hit& h : hits) {
    if (h.special_index != current) {
      current = h.special_index;
      last_end = 0;
    }
    const int32_t id = specials_[h.special_index];
    const size_t len = vocab_.tokens[id].size();
    if (h.pos < last_end) continue;
    bool free = true;
    for (size_t i = h.pos; i < h.pos + len && free; ++i) free = !s.covered[i];
    if (!free) continue;
    std::memset(s.covered.data() + h.pos, 1, len);
    claims.push_back({h.pos, len, id});
    last_end = h.pos + len;
  }
  std::sort(claims.begin(), claims.end(),
            [](const Claim& a, const Claim& b) { return a.pos < b.pos; });
  size_t cursor = 0;
  for (const Claim& c : claims) {
    if (c.pos > cursor) s.segments.push_back({cursor, c.pos, -1});
    s.segments.push_back({c.pos, c.pos + c.len, c.token});
    cursor = c.pos + c.len;
  }
  if (cursor < text.size()) s.segments.push_back({cursor, text.size(), -1});
}

void Tokenizer::EncodeBpeText(std::string_view text, Scratch& s, std::vector<int32_t>* out) const {
  if (s.cache_owner != instance_id_) {
    s.word_cache.clear();
    s.cached_ids.clear();
    s.cache_owner = instance_id_;
  }
  auto encode_word = [&](size_t begin, size_t end, std::string_view chunk) {
    const std::string_view word = chunk.substr(begin, end - begin);
    if (word.size() < Scratch::kMinCachedLength || word.size() > Scratch::kMaxCachedLength) {
      EncodeBpeWord(word, s, out);
      return;
    }
    const absl::string_view key(word.data(), word.size());
    if (auto it = s.word_cache.find(key); it != s.word_cache.end()) {
      const int32_t* ids = s.cached_ids.data() + it->second.first;
      out->insert(out->end(), ids, ids + it->second.second);
      return;
    }
    const size_t before = out->size();
    EncodeBpeWord(word, s, out);
    if (s.word_cache.size() >= Scratch::kMaxCachedWords) {
      s.word_cache.clear();
      s.cached_ids.clear();
    }
    const auto offset = static_cast<uint32_t>(s.cached_ids.size());
    s.cached_ids.insert(s.cached_ids.end(), out->begin() + before, out->end());
    s.word_cache.emplace(std::string(word),
                         std::make_pair(offset, static_cast<uint32_t>(out->size() - before)));
  };
  // Pre-tokenize in chunks of about kChunk bytes, cut after a lone '\n' between two ASCII
  // non-space bytes ("x\ny"): every supported pre-tokenizer ends a word there (the newline is
  // a one-character whitespace run, or ends a punctuation run) and starts a new one after it.
  constexpr size_t kChunk = 1 << 16;
  size_t start = 0;
  while (start < text.size()) {
    size_t cut = text.size();
    if (text.size() - start > 2 * kChunk) {
      for (size_t p = start + kChunk; p + 1 < text.size(); ++p) {
        const auto prev = static_cast<unsigned char>(text[p - 1]);
        const auto next = static_cast<unsigned char>(text[p + 1]);
        if (text[p] == '\n' && prev > 0x20 && prev < 0x7F && next > 0x20 && next < 0x7F) {
          cut = p + 1;
          break;
        }
      }
    }
    const std::string_view chunk = text.substr(start, cut - start);
    pretok::DecodeUnits(chunk, &s.units);
    pretok::Split(vocab_.pre, s.units,
                  [&](size_t begin, size_t end) { encode_word(begin, end, chunk); });
    start = cut;
  }
}

void Tokenizer::EmitBpeSymbol(int32_t sym, std::vector<int32_t>* out) const {
  const int32_t n = vocab_.size();
  if (sym >= 0 && sym < n) {
    out->push_back(sym);
    return;
  }
  if (sym < n) return;  // a byte with no token: dropped, as llama.cpp does
  // A merge result that is not a token: its bytes one by one (those without a token dropped).
  for (char c : *extra_symbols_[sym - n]) {
    const int32_t b = byte_symbol_[static_cast<uint8_t>(c)];
    if (b >= 0 && b < n) out->push_back(b);
  }
}

void Tokenizer::EncodeBpeWord(std::string_view word, Scratch& s, std::vector<int32_t>* out) const {
  const auto* bytes = reinterpret_cast<const uint8_t*>(word.data());
  const auto n = static_cast<int32_t>(word.size());
  if (n == 1) {
    EmitBpeSymbol(byte_symbol_[bytes[0]], out);
    return;
  }
  if (ignore_merges_) {
    auto it = bpe_symbol_of_.find(word);
    if (it != bpe_symbol_of_.end() && it->second < vocab_.size()) {
      out->push_back(it->second);
      return;
    }
  }
  auto& sym = s.symbols;
  sym.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {byte_symbol_[bytes[i]], i - 1, i + 1 < n ? i + 1 : -1, 0, 0};
  }
  auto& heap = s.bpe_heap;
  heap.clear();
  auto cmp = [](const Scratch::BpeCandidate& a, const Scratch::BpeCandidate& b) {
    return a.key > b.key;  // min-heap on (rank, left)
  };
  auto try_push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t ls = sym[left].sym, rs = sym[right].sym;
    if (ls < 0 || rs < 0) return;
    auto it = merges_.find((static_cast<uint64_t>(ls) << 32) | static_cast<uint32_t>(rs));
    if (it == merges_.end()) return;
    heap.push_back({(static_cast<uint64_t>(it->second.rank) << 32) | static_cast<uint32_t>(left),
                    right, ls, rs, it->second.result});
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Scratch::BpeCandidate c = heap.back();
    heap.pop_back();
    const auto left = static_cast<int32_t>(c.key & 0xFFFFFFFFu);
    // Stale: a side was merged into something else since this candidate was pushed.
    if (sym[left].sym != c.left_sym || sym[left].next != c.right ||
        sym[c.right].sym != c.right_sym) {
      continue;
    }
    sym[left].sym = c.result;
    const int32_t next = sym[c.right].next;
    sym[left].next = next;
    sym[c.right].sym = -2;
    if (next >= 0) sym[next].prev = left;
    try_push(sym[left].prev, left);
    try_push(left, next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) EmitBpeSymbol(sym[i].sym, out);
}

absl::Status Tokenizer::EncodeSpmText(std::string_view text, bool space_prefix, Scratch& s,
                                      std::vector<int32_t>* out) const {
  std::string& esc = s.escaped;
  esc.clear();
  if (space_prefix) esc += kSpmSpace;
  // Spaces become "▁". A byte that is not UTF-8 (unicode::DecodeUtf8Lenient rejects it) stays
  // when the vocab has its byte token (byte fallback keeps the text exact, as in llama.cpp);
  // otherwise it becomes U+FFFD, tokenized like any other character.
  for (size_t pos = 0; pos < text.size();) {
    const auto byte = static_cast<uint8_t>(text[pos]);
    if (byte < 0x80) {
      if (byte == ' ') {
        esc += kSpmSpace;
      } else {
        esc.push_back(static_cast<char>(byte));
      }
      ++pos;
      continue;
    }
    const size_t start = pos;
    const uint32_t cp = unicode::DecodeUtf8Lenient(text, &pos);
    if (cp >= unicode::kInvalidBase && byte_token_[byte] < 0) {
      esc += kReplacement;
    } else {
      esc += text.substr(start, pos - start);
    }
  }
  if (esc.empty()) return absl::OkStatus();
  if (esc.size() >= UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Encode: text of ", text.size(), " bytes exceeds the 4 GiB limit once spaces are ",
        "escaped as U+2581 and invalid UTF-8 bytes replaced by U+FFFD"));
  }
  auto& sym = s.symbols;
  sym.clear();
  for (size_t pos = 0; pos < esc.size();) {
    const size_t start = pos;
    // Symbols are characters; a byte left invalid above is a symbol of its own (llama.cpp
    // would group it with the bytes its lead bits announce, even an escaped space).
    unicode::DecodeUtf8Lenient(esc, &pos);
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({0, i - 1, -1, static_cast<uint32_t>(start), static_cast<uint32_t>(pos - start)});
    if (i > 0) sym[i - 1].next = i;
  }
  auto& heap = s.spm_heap;
  heap.clear();
  auto cmp = [](const Scratch::SpmCandidate& a, const Scratch::SpmCandidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);  // max score, min left
  };
  auto try_push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = sym[left].len + sym[right].len;
    auto it = spm_token_of_.find(std::string_view(esc).substr(sym[left].begin, size));
    if (it == spm_token_of_.end()) return;
    heap.push_back({vocab_.score(it->second), left, right, size});
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) try_push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const Scratch::SpmCandidate c = heap.back();
    heap.pop_back();
    auto& l = sym[c.left];
    auto& r = sym[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.size) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    try_push(l.prev, c.left);
    try_push(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = std::string_view(esc).substr(sym[i].begin, sym[i].len);
    auto it = spm_token_of_.find(piece);
    if (it != spm_token_of_.end()) {
      out->push_back(it->second);
      continue;
    }
    // Not a token: a single character (merges only form tokens). Byte tokens, else unknown.
    bool all_bytes = true;
    for (char c : piece) all_bytes = all_bytes && byte_token_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) out->push_back(byte_token_[static_cast<uint8_t>(c)]);
    } else if (vocab_.unk >= 0) {
      out->push_back(vocab_.unk);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "Encode: character at byte offset ", sym[i].begin, " of the escaped text (byte 0x",
          absl::Hex(static_cast<uint8_t>(piece[0]), absl::kZeroPad2),
          ") has no token, no byte token and the vocab has no unknown token",
          piece == kReplacement ? " (U+FFFD, which replaces a byte that is not UTF-8)" : ""));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Decode

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool render_special) const {
  std::string out;
  bool strip = strips_leading_space();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= n_vocab()) {
      return absl::InvalidArgumentError(absl::StrCat("Decode: token id ", id, " at index ", i,
                                                     " is out of range [0, ", n_vocab(), ")"));
    }
    const size_t before = out.size();
    KILN_RETURN_IF_ERROR(TokenPiece(id, render_special, &out));
    if (strip && out.size() > before) {
      if (types_[id] == TokenType::kNormal && out[before] == ' ') out.erase(before, 1);
      strip = false;
    }
  }
  return out;
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  return vocab_.tokens[id];
}

absl::Status Tokenizer::TokenPiece(int32_t id, bool render_special, std::string* out) const {
  if (id < 0 || id >= n_vocab()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenPiece: token id ", id, " is out of range [0, ", n_vocab(), ")"));
  }
  const TokenType t = types_[id];
  if ((t == TokenType::kControl || t == TokenType::kUnknown) && !render_special) {
    return absl::OkStatus();
  }
  out->append(Piece(id));
  return absl::OkStatus();
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return id >= 0 && id < n_vocab() && eog_[id] != 0;
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < n_vocab() && types_[id] == TokenType::kControl;
}

TokenType Tokenizer::type(int32_t id) const {
  return id >= 0 && id < n_vocab() ? types_[id] : TokenType::kUndefined;
}

}  // namespace kiln
