package kiln

// The Go side of the C callbacks. A file with //export may only declare C functions, so the C
// trampolines that pass these to kiln live in bridge.c.

/*
#include <stdint.h>
#include <stddef.h>
#include <kiln/kiln.h>
*/
import "C"

import "runtime/cgo"

// goKilnProgress receives a load's progress; non-zero cancels the load.
//
//export goKilnProgress
func goKilnProgress(progress C.float, handle C.uintptr_t) C.int {
	state := cgo.Handle(handle).Value().(*loadState)
	if state.ctx.Err() != nil {
		return 1
	}
	if state.progress != nil && !state.progress(float32(progress)) {
		return 1
	}
	return 0
}

// goKilnLog receives a load's log line.
//
//export goKilnLog
func goKilnLog(level C.int, message *C.char, handle C.uintptr_t) {
	state := cgo.Handle(handle).Value().(*loadState)
	if state.log != nil {
		state.log(LogLevel(level), C.GoString(message))
	}
}

// requestState holds a submitted request's callbacks until the next Submit or Close.
type requestState struct {
	onToken func(token int32, piece string) bool
	onDone  func(err error, reason StopReason, nTokens int32)
}

// goKilnRequestToken receives a submitted request's token; non-zero ends the request.
//
//export goKilnRequestToken
func goKilnRequestToken(token C.int32_t, piece *C.char, pieceLen C.size_t, handle C.uintptr_t) C.int {
	state := cgo.Handle(handle).Value().(*requestState)
	if state.onToken(int32(token), C.GoStringN(piece, C.int(pieceLen))) {
		return 0
	}
	return 1
}

// goKilnRequestDone receives the end of a submitted request; the message of a failure is read at
// once, on the thread of the failed step.
//
//export goKilnRequestDone
func goKilnRequestDone(status C.int, reason C.int, nTokens C.int32_t, handle C.uintptr_t) {
	state := cgo.Handle(handle).Value().(*requestState)
	var err error
	if status != C.KILN_OK {
		err = &Error{Status: Status(status), Message: C.GoString(C.kiln_last_error_message())}
		reason = 0
	}
	state.onDone(err, StopReason(reason), int32(nTokens))
}

// goKilnToken receives a generated token and its text; non-zero stops the generate.
//
//export goKilnToken
func goKilnToken(token C.int32_t, piece *C.char, pieceLen C.size_t, handle C.uintptr_t) C.int {
	state := cgo.Handle(handle).Value().(*generateState)
	text := C.GoStringN(piece, C.int(pieceLen))
	state.text = append(state.text, text...)
	if token >= 0 {
		state.tokens = append(state.tokens, int32(token))
	}
	if state.ctx.Err() != nil {
		return 1
	}
	if state.onToken != nil && !state.onToken(int32(token), text) {
		state.stoppedByCallback = true
		return 1
	}
	return 0
}
