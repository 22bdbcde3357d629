// C trampolines: kiln calls these with the user_data the binding set (a cgo.Handle), and they
// forward to the exported Go functions in callbacks.go.
#include <kiln/kiln.h>

#include "_cgo_export.h"

int kiln_go_progress(float progress, void* user_data) {
  return goKilnProgress(progress, (uintptr_t)user_data);
}

void kiln_go_log(kiln_log_level level, const char* message, void* user_data) {
  goKilnLog((int)level, (char*)message, (uintptr_t)user_data);
}

int kiln_go_request_token(int32_t token, const char* piece, size_t piece_len, void* user_data) {
  return goKilnRequestToken(token, (char*)piece, piece_len, (uintptr_t)user_data);
}

void kiln_go_request_done(kiln_session* session, kiln_status status, kiln_stop_reason reason,
                          int32_t n_tokens, void* user_data) {
  (void)session;
  goKilnRequestDone((int)status, (int)reason, n_tokens, (uintptr_t)user_data);
}

int kiln_go_token(int32_t token, const char* piece, size_t piece_len, void* user_data) {
  return goKilnToken(token, (char*)piece, piece_len, (uintptr_t)user_data);
}
