package kiln

// The Go side of the C callbacks. A file with //export may only declare C functions, so the C
// trampolines that pass these to kiln live in bridge.c.

/*
#include <stdint.h>
#include <stddef.h>
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
