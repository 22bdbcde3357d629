// The C API's one rule for versioned structs (kiln.h, "Versioned structs"), enforced here and
// nowhere else: every entry point that reads or fills such a struct goes through
// VersionedStruct<T>, so the library never touches a byte past the caller's struct_size.
//
// Adding a field to a struct in a new release: append it at the end of the struct in kiln.h,
// note "Added in X.Y" there, and append the end of the new last field to the struct's
// StructReleases<T>::kEnds below.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "include/kiln/kiln.h"
#include "lib/common/status.h"

namespace kiln::c_api {

// Records `message` as this thread's kiln_last_error_message() and returns `status`
// (c_api.cc).
kiln_status SetLastError(kiln_status status, std::string message);

// Where `field` of `type` ends: offsetof plus its size, without the trailing padding that sizeof
// of a struct ending with that field would add.
#define KILN_FIELD_END(type, field) \
  (offsetof(type, field) + sizeof(static_cast<type*>(nullptr)->field))

// One specialization per versioned struct: its name, the init function that fills it (nullptr
// for output structs, which the caller sizes by hand) and kEnds, where the last field of each
// release that grew the struct ends, oldest first. kEnds[0] is the smallest struct_size
// accepted.
template <typename T>
struct StructReleases;

template <>
struct StructReleases<kiln_model_params> {
  static constexpr const char* kName = "kiln_model_params";
  static constexpr const char* kInit = "kiln_model_params_init";
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_model_params, log_user_data)};  // 0.2
};
template <>
struct StructReleases<kiln_model_info> {
  static constexpr const char* kName = "kiln_model_info";
  static constexpr const char* kInit = nullptr;
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_model_info, token_eot)};  // 0.2
};
template <>
struct StructReleases<kiln_cache_params> {
  static constexpr const char* kName = "kiln_cache_params";
  static constexpr const char* kInit = "kiln_cache_params_init";
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_cache_params, llama_cpp_order),          // ABI 1 baseline
      KILN_FIELD_END(kiln_cache_params, step_tokens),              // 0.2.0 after the baseline
      KILN_FIELD_END(kiln_cache_params, cuda_device),              // 0.2.0: backend, cuda_device
      KILN_FIELD_END(kiln_cache_params, mla_prefill),              // 0.2.0: mla_prefill
      KILN_FIELD_END(kiln_cache_params, sliding_window_sessions),  // 0.2.0
      KILN_FIELD_END(kiln_cache_params, swa_full),                 // 0.2.0: swa_full
      KILN_FIELD_END(kiln_cache_params, pin_threads)};             // 0.2.0: pin_threads
};
template <>
struct StructReleases<kiln_cache_stats> {
  static constexpr const char* kName = "kiln_cache_stats";
  static constexpr const char* kInit = nullptr;
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_cache_stats, block_bytes),           // 0.2
      KILN_FIELD_END(kiln_cache_stats, sliding_block_bytes)};  // 0.2.0: kv_bytes_in_use, sliding
};
template <>
struct StructReleases<kiln_sampler_params> {
  static constexpr const char* kName = "kiln_sampler_params";
  static constexpr const char* kInit = "kiln_sampler_params_init";
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_sampler_params, n_logit_bias)};  // 0.2
};
template <>
struct StructReleases<kiln_generate_params> {
  static constexpr const char* kName = "kiln_generate_params";
  static constexpr const char* kInit = "kiln_generate_params_init";
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_generate_params, user_data)};  // 0.2
};
template <>
struct StructReleases<kiln_generate_result> {
  static constexpr const char* kName = "kiln_generate_result";
  static constexpr const char* kInit = nullptr;
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_generate_result, stop_reason)};  // 0.2
};
template <>
struct StructReleases<kiln_ngram_params> {
  static constexpr const char* kName = "kiln_ngram_params";
  static constexpr const char* kInit = "kiln_ngram_params_init";
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_ngram_params, fixed_pass_cost_beta)};  // 0.2
};
template <>
struct StructReleases<kiln_draft_params> {
  static constexpr const char* kName = "kiln_draft_params";
  static constexpr const char* kInit = "kiln_draft_params_init";
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_draft_params, fixed_pass_cost_beta)};  // 0.2
};
template <>
struct StructReleases<kiln_medusa_params> {
  static constexpr const char* kName = "kiln_medusa_params";
  static constexpr const char* kInit = "kiln_medusa_params_init";
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_medusa_params, n_threads),       // 0.2
      KILN_FIELD_END(kiln_medusa_params, merge_ngram),     // 0.2: merge_ngram
      KILN_FIELD_END(kiln_medusa_params, typical_delta)};  // 0.2: typical acceptance
};
template <>
struct StructReleases<kiln_eagle_params> {
  static constexpr const char* kName = "kiln_eagle_params";
  static constexpr const char* kInit = "kiln_eagle_params_init";
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_eagle_params, n_threads),       // 0.2
      KILN_FIELD_END(kiln_eagle_params, merge_ngram),     // 0.2: merge_ngram
      KILN_FIELD_END(kiln_eagle_params, typical_delta)};  // 0.2: typical acceptance
};
template <>
struct StructReleases<kiln_spec_metrics> {
  static constexpr const char* kName = "kiln_spec_metrics";
  static constexpr const char* kInit = nullptr;
  static constexpr std::array kEnds = {
      KILN_FIELD_END(kiln_spec_metrics, target_passes_per_token),  // 0.2
      KILN_FIELD_END(kiln_spec_metrics, accepted_lossy)};          // 0.2: typical acceptance
};
template <>
struct StructReleases<kiln_state_params> {
  static constexpr const char* kName = "kiln_state_params";
  static constexpr const char* kInit = "kiln_state_params_init";
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_state_params, strategy)};  // 0.2
};

template <>
struct StructReleases<kiln_request_params> {
  static constexpr const char* kName = "kiln_request_params";
  static constexpr const char* kInit = "kiln_request_params_init";
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_request_params, user_data)};  // 0.2
};
template <>
struct StructReleases<kiln_poll_result> {
  static constexpr const char* kName = "kiln_poll_result";
  static constexpr const char* kInit = nullptr;
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_poll_result, n_tokens)};  // 0.2
};
template <>
struct StructReleases<kiln_step_params> {
  static constexpr const char* kName = "kiln_step_params";
  static constexpr const char* kInit = "kiln_step_params_init";
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_step_params, step_tokens)};  // 0.2
};
template <>
struct StructReleases<kiln_step_result> {
  static constexpr const char* kName = "kiln_step_result";
  static constexpr const char* kInit = nullptr;
  static constexpr std::array kEnds = {KILN_FIELD_END(kiln_step_result, elapsed_ms)};  // 0.2
};

template <typename T>
class VersionedStruct {
  using Releases = StructReleases<T>;

  static constexpr bool Ascending() {
    for (size_t i = 1; i < Releases::kEnds.size(); ++i) {
      if (Releases::kEnds[i] <= Releases::kEnds[i - 1]) return false;
    }
    return true;
  }
  static_assert(std::is_trivially_copyable_v<T> && offsetof(T, struct_size) == 0 &&
                std::is_same_v<decltype(T::struct_size), uint32_t>);
  static_assert(Ascending() && Releases::kEnds[0] > sizeof(uint32_t));
  // The newest release's fields end where sizeof(T) (rounded to T's alignment) says: fails when
  // a field was appended to T without its release in kEnds (unless it fit the trailing padding).
  static_assert((Releases::kEnds.back() + alignof(T) - 1) / alignof(T) * alignof(T) == sizeof(T),
                "a field was appended to the struct: add its release to StructReleases::kEnds");

 public:
  // The smallest struct_size accepted: where the first release's last field ends.
  static constexpr size_t kMinSize = Releases::kEnds[0];

  // The bytes of a caller's struct of `struct_size` bytes that the library reads or writes as
  // fields of T: up to the end of the newest release it covers entirely; all of T when it is at
  // least sizeof(T). 0 below the first release.
  static constexpr size_t KnownBytes(size_t struct_size) {
    if (struct_size >= sizeof(T)) return sizeof(T);
    size_t known = 0;
    for (size_t end : Releases::kEnds) {
      if (end <= struct_size) known = end;
    }
    return known;
  }

  // KILN_OK when a struct of `struct_size` bytes is accepted; otherwise
  // KILN_ERR_INVALID_ARGUMENT with a message "<fn>: <what> <size> is ...".
  static kiln_status CheckSize(const char* fn, const char* what, size_t struct_size) {
    if (struct_size > UINT32_MAX) {
      return SetLastError(KILN_ERR_INVALID_ARGUMENT,
                          StrCat(fn, ": ", what, " ", struct_size, " is larger than any ",
                                 Releases::kName, " (struct_size is a uint32_t)"));
    }
    if (struct_size >= kMinSize) return KILN_OK;
    std::string how = Releases::kInit != nullptr
                          ? StrCat("fill it with ", Releases::kInit, "(&p, sizeof p)")
                          : StrCat("set it to sizeof(", Releases::kName, ")");
    return SetLastError(KILN_ERR_INVALID_ARGUMENT,
                        StrCat(fn, ": ", what, " ", struct_size, " is below ", kMinSize,
                               ", the size of ", Releases::kName, " as first released; ", how));
  }

  // Reads the caller's struct: *out = defaults, overwritten by the fields inside
  // in->struct_size. `what` names the argument ("params").
  static kiln_status Read(const char* fn, const char* what, const T* in, const T& defaults,
                          T* out) {
    const uint32_t struct_size = in->struct_size;
    const kiln_status s = CheckSize(fn, StrCat(what, "->struct_size").c_str(), struct_size);
    if (s != KILN_OK) return s;
    *out = defaults;
    std::memcpy(out, in, KnownBytes(struct_size));
    return KILN_OK;
  }

  // Writes `value` into the caller's struct `out` of `struct_size` bytes: the fields inside it,
  // struct_size itself, and zeros over the bytes past sizeof(T) (fields of a newer header).
  static kiln_status Write(const char* fn, const char* what, const T& value, size_t struct_size,
                           T* out) {
    const kiln_status s = CheckSize(fn, what, struct_size);
    if (s != KILN_OK) return s;
    T copy = value;
    copy.struct_size = static_cast<uint32_t>(struct_size);
    std::memcpy(out, &copy, KnownBytes(struct_size));
    if (struct_size > sizeof(T)) {
      std::memset(reinterpret_cast<char*>(out) + sizeof(T), 0, struct_size - sizeof(T));
    }
    return KILN_OK;
  }

  // Fills an output struct whose struct_size the caller set.
  static kiln_status WriteOutput(const char* fn, const char* what, const T& value, T* out) {
    return Write(fn, StrCat(what, "->struct_size").c_str(), value, out->struct_size, out);
  }

  // A T with every byte zero (padding included, so nothing uninitialized is copied out).
  static T Zeroed() {
    T t;
    std::memset(&t, 0, sizeof t);
    return t;
  }
};

}  // namespace kiln::c_api
