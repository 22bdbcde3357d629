// The extern "C" layer: every entry point catches everything, maps absl::Status to kiln_status
// and records the message per thread.
#include <new>
#include <string>

#include "include/kiln/kiln.h"
#include "lib/common/status.h"

namespace {

thread_local std::string g_last_error;

}  // namespace

extern "C" {

const char* kiln_version(void) { return "0.1.0"; }
int kiln_abi_version(void) { return KILN_ABI_VERSION; }

const char* kiln_status_name(kiln_status status) {
  switch (status) {
    case KILN_OK: return "KILN_OK";
    case KILN_ERR_INVALID_ARGUMENT: return "KILN_ERR_INVALID_ARGUMENT";
    case KILN_ERR_IO: return "KILN_ERR_IO";
    case KILN_ERR_FORMAT: return "KILN_ERR_FORMAT";
    case KILN_ERR_UNSUPPORTED: return "KILN_ERR_UNSUPPORTED";
    case KILN_ERR_OUT_OF_MEMORY: return "KILN_ERR_OUT_OF_MEMORY";
    case KILN_ERR_CACHE_FULL: return "KILN_ERR_CACHE_FULL";
    case KILN_ERR_CANCELLED: return "KILN_ERR_CANCELLED";
    case KILN_ERR_OUT_OF_RANGE: return "KILN_ERR_OUT_OF_RANGE";
    case KILN_ERR_BUFFER_TOO_SMALL: return "KILN_ERR_BUFFER_TOO_SMALL";
    case KILN_ERR_BUSY: return "KILN_ERR_BUSY";
    case KILN_ERR_INTERNAL: return "KILN_ERR_INTERNAL";
  }
  return "KILN_ERR_UNKNOWN";
}

const char* kiln_last_error_message(void) { return g_last_error.c_str(); }

}  // extern "C"
