#include "lib/session/session_state.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/escaping.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "lib/gguf/gguf.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#elif defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

namespace kiln::state {
namespace {

// ------------------------------------------------------------------ CRC-32C

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// ------------------------------------------------------------------ fingerprint hash

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// SplitMix64's finalizer.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;

// A fast 64-bit hash of bytes (four independent multiply-rotate lanes, so the loop is not one
// long dependency chain), then the length, then a final avalanche. Not cryptographic: it tells
// models apart, it does not resist someone forging a collision.
uint64_t HashBytes(const uint8_t* p, size_t n, uint64_t seed) {
  uint64_t v[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) v[j] = Rotl(v[j] + Load64(p + i + 8 * j) * kP2, 31) * kP1;
  }
  uint64_t h = Rotl(v[0], 1) + Rotl(v[1], 7) + Rotl(v[2], 12) + Rotl(v[3], 18);
  for (; i + 8 <= n; i += 8) h = Rotl(h ^ (Load64(p + i) * kP2), 27) * kP1;
  for (; i < n; ++i) h = Rotl(h ^ (p[i] * kP1), 11) * kP2;
  return Mix64(h ^ static_cast<uint64_t>(n));
}

// SessionStateFile's field tags: (field number << 3) | wire type.
constexpr uint8_t kMagicTag = (1 << 3) | 2;    // length-delimited
constexpr uint8_t kVersionTag = (2 << 3) | 0;  // varint
constexpr uint8_t kCrcTag = (3 << 3) | 5;      // fixed32
constexpr uint8_t kPayloadTag = (4 << 3) | 2;  // length-delimited

// A parsed SessionStateFile whose payload is a view into the input (the generated parser would
// copy it, and for K/V states that copy is a large part of a restore).
struct Envelope {
  std::string magic;
  uint32_t format_version = 0;
  uint32_t payload_crc32c = 0;
  std::string_view payload;
};

// Parses `bytes` as a SessionStateFile the way protobuf does: any field order, the last
// occurrence of a field wins, unknown fields skipped. False when the bytes are not a valid
// message (truncated fields included).
bool ParseEnvelope(std::string_view bytes, Envelope* out) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.CurrentPosition() == static_cast<int>(bytes.size());
    switch (tag) {
      case kMagicTag:
        if (!google::protobuf::internal::WireFormatLite::ReadString(&in, &out->magic)) {
          return false;
        }
        break;
      case kVersionTag:
        if (!in.ReadVarint32(&out->format_version)) return false;
        break;
      case kCrcTag:
        if (!in.ReadLittleEndian32(&out->payload_crc32c)) return false;
        break;
      case kPayloadTag: {
        uint32_t length = 0;
        if (!in.ReadVarint32(&length)) return false;
        const size_t at = static_cast<size_t>(in.CurrentPosition());
        if (length > bytes.size() - at) return false;
        out->payload = bytes.substr(at, length);
        if (!in.Skip(static_cast<int>(length))) return false;
        break;
      }
      default:
        if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) return false;
        break;
    }
  }
}

absl::Status Malformed(std::string_view what) {
  return absl::DataLossError(kiln::StrCat("malformed session state: ", what));
}

bool FiniteNonNegative(double x) { return std::isfinite(x) && x >= 0.0; }

absl::Status CheckCost(const PassCostState& c, const StateTarget& target) {
  const size_t widths = static_cast<size_t>(target.max_timed_width) + 1;
  if (static_cast<size_t>(c.t_width_size()) != widths ||
      static_cast<size_t>(c.seen_at_size()) != widths) {
    return Malformed(kiln::StrCat("the pass-cost model has ", c.t_width_size(),
                                  " timed widths and ", c.seen_at_size(),
                                  " observation marks; expected ", widths));
  }
  if (!FiniteNonNegative(c.t1()) || !std::isfinite(c.slope()) ||
      !FiniteNonNegative(c.pinned_beta()) || c.n1() < 0 || c.n_wide() < 0) {
    return Malformed("the pass-cost model holds a negative or non-finite value");
  }
  for (int i = 0; i < c.t_width_size(); ++i) {
    if (!FiniteNonNegative(c.t_width(i)) || c.seen_at(i) < 0 || c.seen_at(i) > c.n_wide()) {
      return Malformed(kiln::StrCat("the pass-cost model's width ", i, " is out of range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(__SSE4_2__) && defined(__x86_64__)
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) c = _mm_crc32_u64(c, Load64(p + i));
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; i < size; ++i) c32 = _mm_crc32_u8(c32, p[i]);
  return ~c32;
#elif defined(__ARM_FEATURE_CRC32)
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) c = __crc32cd(c, Load64(p + i));
  for (; i < size; ++i) c = __crc32cb(c, p[i]);
  return ~c;
#else
  return Crc32cPortable(data, size, crc);
#endif
}

uint64_t ModelFingerprintOf(const gguf::GgufFile& file) {
  const uint64_t header = std::min<uint64_t>(file.data_offset(), file.file_size());
  uint64_t h = HashBytes(file.bytes(), static_cast<size_t>(header), 0x6b696c6e2e667072ULL);
  constexpr uint64_t kSample = 64;
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (t.data == nullptr || t.nbytes == 0) continue;
    if (t.nbytes <= 3 * kSample) {
      h = Mix64(h ^ HashBytes(t.data, static_cast<size_t>(t.nbytes), h));
      continue;
    }
    for (uint64_t at : {uint64_t{0}, (t.nbytes - kSample) / 2, t.nbytes - kSample}) {
      h = Mix64(h ^ HashBytes(t.data + at, kSample, h));
    }
  }
  return h;
}

absl::StatusOr<std::string> Encode(const SessionState& payload) {
  const size_t payload_bytes = payload.ByteSizeLong();  // also caches the sizes for below
  // The envelope adds the magic, the version, the checksum and field headers (< 64 bytes).
  if (payload_bytes > kMaxStateBytes - 64) {
    return absl::OutOfRangeError(kiln::StrCat(
        "the session state would take ", payload_bytes,
        " bytes, more than a state can hold (2 GiB, protobuf's message limit); save it without "
        "K/V (tokens only) instead"));
  }
  // Written as SessionStateFile's serializer would write it (fields in number order, the
  // payload last), but with the payload serialized in place instead of into a string that is
  // then copied: for K/V states that copy is a large part of a save.
  SessionStateFile header;  // the envelope's fields before the payload
  header.set_magic(std::string(kMagic));
  header.set_format_version(kFormatVersion);
  header.set_payload_crc32c(1);  // a placeholder: any non-zero fixed32 takes the same bytes
  size_t header_bytes = header.ByteSizeLong();
  uint8_t length[10];
  const size_t length_bytes = static_cast<size_t>(
      google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(payload_bytes, length) -
      length);
  size_t start = header_bytes + 1 + length_bytes;
  std::string out(start + payload_bytes, '\0');
  auto* bytes = reinterpret_cast<uint8_t*>(out.data());
  uint8_t* end = payload.SerializeWithCachedSizesToArray(bytes + start);
  if (end != bytes + start + payload_bytes) {
    return absl::InternalError("SessionState: protobuf serialization size mismatch");
  }
  const uint32_t crc = Crc32c(bytes + start, payload_bytes);
  header.set_payload_crc32c(crc);
  if (header.ByteSizeLong() != header_bytes) {
    // A CRC of 0 is the field's default, which proto3 does not write: the header shrinks.
    const size_t shrink = header_bytes - header.ByteSizeLong();
    std::memmove(bytes + start - shrink, bytes + start, payload_bytes);
    out.resize(out.size() - shrink);
    header_bytes -= shrink;
    start -= shrink;
  }
  header.SerializeWithCachedSizesToArray(bytes);
  bytes[header_bytes] = kPayloadTag;
  std::memcpy(bytes + header_bytes + 1, length, length_bytes);
  return out;
}

absl::Status Decode(std::string_view bytes, const StateTarget& target, SessionState* out) {
  if (bytes.size() > kMaxStateBytes) {
    return absl::DataLossError(kiln::StrCat("not a kiln session state: ", bytes.size(),
                                            " bytes, more than a state can hold (2 GiB)"));
  }
  Envelope file;
  if (!ParseEnvelope(bytes, &file)) {
    return absl::DataLossError(
        kiln::StrCat("not a kiln session state, or a truncated or corrupted one: its ",
                     bytes.size(), " bytes do not parse as a SessionStateFile message"));
  }
  if (file.magic != kMagic) {
    return absl::DataLossError(kiln::StrCat("not a kiln session state: the magic string is \"",
                                            absl::CHexEscape(file.magic.substr(0, 32)),
                                            "\", expected \"", kMagic, "\""));
  }
  if (file.format_version == 0) {
    return absl::DataLossError("corrupted session state: format version 0");
  }
  if (file.format_version > kFormatVersion) {
    return absl::UnimplementedError(kiln::StrCat(
        "the session state has format version ", file.format_version,
        ", newer than this kiln reads (up to ", kFormatVersion, "); restore it with a newer kiln"));
  }
  const std::string_view payload = file.payload;
  const uint32_t crc = Crc32c(payload.data(), payload.size());
  if (crc != file.payload_crc32c) {
    return absl::DataLossError(absl::StrFormat(
        "corrupted or truncated session state: the payload's CRC-32C is %08x, the state says "
        "%08x (%d payload bytes)",
        crc, file.payload_crc32c, payload.size()));
  }
  if (!out->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return Malformed("the payload does not parse as a SessionState message");
  }
  const SessionState& s = *out;

  if (s.model().hash() != target.model_fingerprint) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the session state was saved from another model: %s (fingerprint %016x); this cache runs "
        "%s (fingerprint %016x)",
        s.model().description().empty() ? std::string("an unnamed model") : s.model().description(),
        s.model().hash(), target.model_description, target.model_fingerprint));
  }
  const int64_t n = s.tokens_size();
  if (n > target.n_ctx) {
    return absl::OutOfRangeError(kiln::StrCat(
        "the session state holds ", n, " tokens, more than this cache's n_ctx = ", target.n_ctx));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = s.tokens(static_cast<int>(i));
    if (t < 0 || t >= target.n_vocab) {
      return Malformed(kiln::StrCat("token id ", t, " at index ", i,
                                    " is outside [0, n_vocab = ", target.n_vocab, ")"));
    }
  }
  if (s.n_computed() < 0 || s.n_computed() > n) {
    return Malformed(
        kiln::StrCat("n_computed ", s.n_computed(), " is outside [0, ", n, " tokens]"));
  }
  if (s.has_kv()) {
    const KvData& kv = s.kv();
    if (kv.elem_type() != static_cast<uint32_t>(target.kv_type)) {
      return absl::InvalidArgumentError(kiln::StrCat(
          "the session state's K/V are ", GgmlTypeName(kv.elem_type()), ", this cache holds ",
          GgmlTypeName(static_cast<uint32_t>(target.kv_type)),
          ": restore into a cache of the same kv_type, or save the state without K/V"));
    }
    if (kv.row_elems() != static_cast<uint32_t>(target.kv_row_elems) ||
        kv.tiles_size() != target.kv_tiles) {
      return Malformed(kiln::StrCat("K/V of ", kv.tiles_size(), " tiles of rows of ",
                                    kv.row_elems(), " elements; the model has ", target.kv_tiles,
                                    " tiles of ", target.kv_row_elems));
    }
    const size_t n_layers = target.kv_sliding_layers.size();
    if (kv.sliding_first_row() > static_cast<uint32_t>(s.n_computed()) ||
        (kv.sliding_first_row() > 0 &&
         (n_layers == 0 || kv.tiles_size() % static_cast<int>(n_layers) != 0))) {
      return Malformed(kiln::StrCat(
          "K/V of sliding-window layers from row ", kv.sliding_first_row(), " of ", s.n_computed(),
          " computed tokens", n_layers == 0 ? " on a model without sliding layers" : ""));
    }
    const int tiles_per_layer = n_layers == 0 ? 1 : kv.tiles_size() / static_cast<int>(n_layers);
    for (int i = 0; i < kv.tiles_size(); ++i) {
      const bool sliding = n_layers != 0 && target.kv_sliding_layers[i / tiles_per_layer] != 0;
      const uint32_t rows =
          static_cast<uint32_t>(s.n_computed()) - (sliding ? kv.sliding_first_row() : 0u);
      const size_t tile_bytes = static_cast<size_t>(rows) * target.kv_row_bytes;
      if (kv.tiles(i).size() != tile_bytes) {
        return Malformed(kiln::StrCat("K/V tile ", i, " has ", kv.tiles(i).size(), " bytes; ", rows,
                                      " rows need ", tile_bytes));
      }
    }
  }
  if (s.logits_size() != 0) {
    if (s.logits_size() != target.n_vocab) {
      return Malformed(
          kiln::StrCat(s.logits_size(), " logits; the model has n_vocab = ", target.n_vocab));
    }
    if (!s.has_kv() || s.n_computed() != n || n == 0) {
      return Malformed("logits without the K/V of every token");
    }
  }
  for (const LogitBias& b : s.sampler().logit_bias()) {
    if (b.token() < 0 || b.token() >= target.n_vocab) {
      return Malformed(kiln::StrCat("logit bias token ", b.token(),
                                    " is outside [0, n_vocab = ", target.n_vocab, ")"));
    }
  }
  if (s.rng_state_size() != 4) {
    return Malformed(
        kiln::StrCat("the random generator state has ", s.rng_state_size(), " words; expected 4"));
  }
  if ((s.rng_state(0) | s.rng_state(1) | s.rng_state(2) | s.rng_state(3)) == 0) {
    return Malformed("the random generator state is all zero (xoshiro256** never reaches it)");
  }
  for (const TokenLogprob& lp : s.last_logprobs()) {
    if (lp.token() < 0 || lp.token() >= target.n_vocab) {
      return Malformed(kiln::StrCat("logprob token ", lp.token(),
                                    " is outside [0, n_vocab = ", target.n_vocab, ")"));
    }
  }
  if (s.last_logprobs_size() > target.n_vocab) {
    return Malformed("more top log-probabilities than the vocabulary has tokens");
  }
  if (s.has_speculative() && s.speculative().has_cost()) {
    KILN_RETURN_IF_ERROR(CheckCost(s.speculative().cost(), target));
  }
  if (s.has_speculative() && s.speculative().strategy().empty() &&
      !s.speculative().strategy_state().empty()) {
    return Malformed("a strategy state without the strategy's name");
  }
  return absl::OkStatus();
}

}  // namespace kiln::state
