// Reading and writing saved session states (Session::SaveState / LoadState; the format is
// lib/session/session_state.proto, described in docs/session_state.md).
//
// A state is a SessionStateFile envelope around a serialized SessionState payload. Encode()
// wraps a payload (magic, format version, CRC-32C); Decode() is the one reader: it checks the
// envelope, then the payload against what the restoring session's engine runs (StateTarget), so
// that everything Session::LoadState later relies on (sizes, ranges, the model) is already
// verified and a bad state is refused before anything changes. Statuses of Decode:
//   DataLoss         not a session state, truncated, corrupted (checksum mismatch), or
//                    malformed content (a size or value out of range); the message says which.
//   Unimplemented    written by a newer kiln (format version above kFormatVersion).
//   InvalidArgument  saved from another model (the message names both), or its K/V are in
//                    another element type than the target cache's.
//   OutOfRange       more tokens than the target's n_ctx.
// This file depends on nothing of the engine (the fuzz target tests/fuzz/state_reader_fuzz.cc
// builds it alone).
//
// Thread-safety: the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/common/ggml_type.h"
#include "lib/common/status.h"
#include "lib/session/session_state.pb.h"

namespace kiln {
namespace gguf {
class GgufFile;
}  // namespace gguf

namespace state {

inline constexpr std::string_view kMagic = "kiln.session_state";
// The payload layout this kiln writes and the newest it reads.
inline constexpr uint32_t kFormatVersion = 1;
// Protobuf messages are limited to 2 GiB; a larger state (K/V of a long context of a large
// model) cannot be written. Save tokens only then.
inline constexpr size_t kMaxStateBytes = (size_t{1} << 31) - 1;

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as in iSCSI and ext4) of data[0, size),
// extending `crc` (the CRC of the bytes before): Crc32c(b, Crc32c(a)) == Crc32c(a + b).
// Crc32c uses the CPU's CRC32 instruction when the build targets one (SSE4.2, ARMv8 CRC);
// Crc32cPortable is the table version, bit for bit the same.
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);

// 64-bit fingerprint of a GGUF model: a hash of the file's header (format version, metadata with
// the architecture, hyper-parameters and vocabulary, tensor names, shapes, types and data
// offsets) and of three 64-byte samples (start, middle, end) of every tensor's data, so that
// two fine-tunes of one architecture differ too. Cost: one pass over the header (about 1.5 MB
// for the default model) plus a few bytes per tensor; well under a millisecond per MB.
uint64_t ModelFingerprintOf(const gguf::GgufFile& file);

// What a state must fit to be restored: the restoring session's model and cache.
struct StateTarget {
  uint64_t model_fingerprint = 0;
  std::string model_description;  // for messages ("llama 'SmolLM2 ...', 30 layers, vocab ...")
  int64_t n_vocab = 0;
  int32_t n_ctx = 0;                  // tokens a session may hold
  GgmlType kv_type = GgmlType::kF16;  // the cache's K/V element type
  int32_t kv_tiles = 0;               // tiles per token: n_layers * tiles_per_layer
  int32_t kv_row_elems = 0;           // elements per row of a tile
  size_t kv_row_bytes = 0;            // bytes per row of a tile
  // [n_layers] when the model has sliding-window layers (non-zero: the layer slides; its tiles
  // may start at KvData.sliding_first_row), else empty.
  std::vector<uint8_t> kv_sliding_layers;
  int32_t max_timed_width = 0;  // spec::PassCostModel::kMaxTimedWidth
};

// The envelope around `payload`. OutOfRange when the state would pass kMaxStateBytes.
absl::StatusOr<std::string> Encode(const SessionState& payload);

// Parses `bytes` into *out and checks it against `target` (see the header comment). On error
// *out is unspecified. Does not validate the sampler parameters beyond their shape
// (Sampler::Validate does) nor the strategy state (the strategy's LoadState does).
absl::Status Decode(std::string_view bytes, const StateTarget& target, SessionState* out);

}  // namespace state
}  // namespace kiln
