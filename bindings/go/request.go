package kiln

/*
#include <stdlib.h>
#include <kiln/kiln.h>

int kiln_go_request_token(int32_t token, const char* piece, size_t piece_len, void* user_data);
void kiln_go_request_done(kiln_session* session, kiln_status status, kiln_stop_reason reason,
                          int32_t n_tokens, void* user_data);

// user_data is a cgo.Handle (an integer), set here so Go never forms a pointer from it.
static void kiln_go_set_request_callbacks(kiln_request_params* p, int on_token, int on_done,
                                          uintptr_t handle) {
  if (on_token) p->on_token = kiln_go_request_token;
  if (on_done) p->on_done = kiln_go_request_done;
  p->user_data = (void*)handle;
}
*/
import "C"

import (
	"context"
	"runtime/cgo"
	"time"
	"unsafe"
)

// ---------------------------------------------------------------- speculative decoding

// Strategy proposes draft tokens that a session verifies in one pass (lossless). It serves one
// session at a time; detach it (SetStrategy(nil)) or close the session before closing it.
type Strategy struct {
	ptr *C.kiln_strategy
}

// NgramOptions are prompt-lookup parameters (kiln_ngram_params); zero values keep kiln's
// defaults.
type NgramOptions struct {
	MaxNgram, MinNgram, MaxDraft, StartDraft int32
	// MaxSkip is the number of plain steps between probes of the pass cost (0: never); nil: 32.
	MaxSkip *int32
	// NoAdaptive drafts max_draft tokens whenever a match is found instead of a cost-aware length.
	NoAdaptive bool
	// FixedPassCostBeta >= 0 fixes a pass over w tokens at 1 + beta (w - 1) one-token passes, so
	// that draft lengths do not depend on timing; nil: the measured cost.
	FixedPassCostBeta *float64
}

// NewNgramStrategy creates an n-gram prompt-lookup strategy (no model).
func NewNgramStrategy(opts NgramOptions) (*Strategy, error) {
	var p C.kiln_ngram_params
	C.kiln_ngram_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	set := func(dst *C.int32_t, v int32) {
		if v != 0 {
			*dst = C.int32_t(v)
		}
	}
	set(&p.max_ngram, opts.MaxNgram)
	set(&p.min_ngram, opts.MinNgram)
	set(&p.max_draft, opts.MaxDraft)
	if opts.StartDraft != 0 {
		p.start_draft = C.int32_t(opts.StartDraft)
	} else if p.start_draft > p.max_draft && p.max_draft > 0 {
		p.start_draft = p.max_draft
	}
	if opts.MaxSkip != nil {
		p.max_skip = C.int32_t(*opts.MaxSkip)
	}
	if opts.NoAdaptive {
		p.adaptive = 0
	}
	if opts.FixedPassCostBeta != nil {
		p.fixed_pass_cost_beta = C.double(*opts.FixedPassCostBeta)
	}
	var ptr *C.kiln_strategy
	if err := call(func() C.kiln_status { return C.kiln_strategy_create_ngram(&p, &ptr) }); err != nil {
		return nil, err
	}
	return &Strategy{ptr: ptr}, nil
}

// NewDraftStrategy creates a draft-model strategy from the GGUF at draftPath (the target's
// vocabulary size); maxDraft 0 and nThreads 0 keep kiln's defaults.
func NewDraftStrategy(target *Model, draftPath string, maxDraft, nThreads int32) (*Strategy, error) {
	return NewDraftStrategyWith(target, draftPath, DraftOptions{MaxDraft: maxDraft, NThreads: nThreads})
}

// DraftOptions are draft-model parameters (kiln_draft_params); zero values keep kiln's defaults.
type DraftOptions struct {
	MaxDraft   int32 // most tokens drafted per step
	NThreads   int32 // draft forward threads; 0: physical cores
	NCtx       int32 // longest context drafted for; 0: min(training context, 8192)
	NoAdaptive bool  // a fixed draft length instead of one adapted to acceptance
	// FixedPassCostBeta >= 0 fixes the pass cost model (see NgramOptions); nil: measured.
	FixedPassCostBeta *float64
}

// NewDraftStrategyWith is NewDraftStrategy with every parameter.
func NewDraftStrategyWith(target *Model, draftPath string, opts DraftOptions) (*Strategy, error) {
	var p C.kiln_draft_params
	C.kiln_draft_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	if opts.MaxDraft != 0 {
		p.max_draft = C.int32_t(opts.MaxDraft)
	}
	p.n_threads = C.int32_t(opts.NThreads)
	p.n_ctx = C.int32_t(opts.NCtx)
	if opts.NoAdaptive {
		p.adaptive = 0
	}
	if opts.FixedPassCostBeta != nil {
		p.fixed_pass_cost_beta = C.double(*opts.FixedPassCostBeta)
	}
	cpath := C.CString(draftPath)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.kiln_strategy
	if err := call(func() C.kiln_status { return C.kiln_strategy_create_draft(target.ptr, cpath, &p, &ptr) }); err != nil {
		return nil, err
	}
	return &Strategy{ptr: ptr}, nil
}

// MedusaOptions are Medusa-head parameters (kiln_medusa_params); zero values keep kiln's
// defaults (the head file's whole tree, one thread).
type MedusaOptions struct {
	MaxDraft int32 // most tree nodes verified per step (the head file's tree, cut)
	NThreads int32 // threads of the heads' LM-head matmul
	// NoMergeNgram leaves out the n-gram prompt-lookup continuation of the context that kiln
	// merges into every tree by default (on top of the head file's tree).
	NoMergeNgram bool
}

// NewMedusaStrategy creates a strategy from the trained Medusa heads in headPath (tools/train/
// makes them; the repository's models/ holds one for the default model). A head trained for
// another model, or a file that is not a head, fails with ErrInvalidArgument saying what
// differs; a missing file with ErrIO. target must outlive the strategy.
func NewMedusaStrategy(target *Model, headPath string, opts MedusaOptions) (*Strategy, error) {
	var p C.kiln_medusa_params
	C.kiln_medusa_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	if opts.MaxDraft != 0 {
		p.max_draft = C.int32_t(opts.MaxDraft)
	}
	if opts.NThreads != 0 {
		p.n_threads = C.int32_t(opts.NThreads)
	}
	if opts.NoMergeNgram {
		p.merge_ngram = 0
	}
	cpath := C.CString(headPath)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.kiln_strategy
	if err := call(func() C.kiln_status { return C.kiln_strategy_create_medusa(target.ptr, cpath, &p, &ptr) }); err != nil {
		return nil, err
	}
	return &Strategy{ptr: ptr}, nil
}

// EagleOptions are EAGLE-head parameters (kiln_eagle_params); zero values keep kiln's defaults
// (the tree's shape and size chosen each step from the measured pass costs, one thread).
type EagleOptions struct {
	TopK       int32 // children per expanded node and nodes expanded per depth, 1..64; 0: chosen each step
	MaxDepth   int32 // deepest draft node, 1..16; 0: deeper while a draft step pays for itself
	TreeTokens int32 // nodes verified per step; 0: chosen from the drafts and the pass cost
	NThreads   int32 // threads of the head's matmuls
	// NoMergeNgram leaves out the n-gram prompt-lookup continuation of the context that kiln
	// merges into every tree by default (on top of TreeTokens).
	NoMergeNgram bool
}

// NewEagleStrategy creates a strategy from the EAGLE head in headPath (architecture "eagle";
// kiln-mkeagle writes untrained ones). A head for another model or a file that is not an eagle
// head fails with ErrInvalidArgument, a malformed one with ErrFormat, a missing one with ErrIO.
// target must outlive the strategy.
func NewEagleStrategy(target *Model, headPath string, opts EagleOptions) (*Strategy, error) {
	var p C.kiln_eagle_params
	C.kiln_eagle_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	if opts.TopK != 0 {
		p.top_k = C.int32_t(opts.TopK)
	}
	if opts.MaxDepth != 0 {
		p.max_depth = C.int32_t(opts.MaxDepth)
	}
	p.tree_tokens = C.int32_t(opts.TreeTokens)
	if opts.NThreads != 0 {
		p.n_threads = C.int32_t(opts.NThreads)
	}
	if opts.NoMergeNgram {
		p.merge_ngram = 0
	}
	cpath := C.CString(headPath)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.kiln_strategy
	if err := call(func() C.kiln_status { return C.kiln_strategy_create_eagle(target.ptr, cpath, &p, &ptr) }); err != nil {
		return nil, err
	}
	return &Strategy{ptr: ptr}, nil
}

// Close frees the strategy; it must not be attached to a live session.
func (st *Strategy) Close() {
	C.kiln_strategy_destroy(st.ptr)
	st.ptr = nil
}

// SetStrategy attaches st (nil: plain decoding) to the session's next generates.
func (s *Session) SetStrategy(st *Strategy) error {
	var ptr *C.kiln_strategy
	if st != nil {
		ptr = st.ptr
	}
	return call(func() C.kiln_status { return C.kiln_session_set_strategy(s.ptr, ptr) })
}

// SpecMetrics are a session's cumulative speculative-decoding counters.
type SpecMetrics struct {
	Steps, Drafted, Accepted, Generated       int64
	MeanAcceptedPerStep, TargetPassesPerToken float64
}

// SpecMetrics reads the session's speculative metrics (zeros without a strategy).
func (s *Session) SpecMetrics() (SpecMetrics, error) {
	var m C.kiln_spec_metrics
	m.struct_size = C.uint32_t(unsafe.Sizeof(m))
	if err := call(func() C.kiln_status { return C.kiln_session_get_spec_metrics(s.ptr, &m) }); err != nil {
		return SpecMetrics{}, err
	}
	return SpecMetrics{int64(m.steps), int64(m.drafted), int64(m.accepted), int64(m.generated),
		float64(m.mean_accepted_per_step), float64(m.target_passes_per_token)}, nil
}

// ---------------------------------------------------------------- non-blocking requests

// Request is a non-blocking request: append a prompt (Text, then Tokens), then generate.
type Request struct {
	Text         string
	AddSpecial   bool // add BOS/EOS to Text as the vocabulary asks
	ParseSpecial bool
	Tokens       []int32
	MaxTokens    int // 0: only compute the prompt
	Stop         []string
	// OnToken receives each token and the text it completed (possibly a partial UTF-8
	// character; token -1: held-back text at the end) on the goroutine that steps the cache
	// (Cache.Step, the worker's thread, a blocking call); returning false ends the request
	// (StopCallback). With OnToken set, Poll returns no text. It must not panic.
	OnToken func(token int32, piece string) bool
	// OnDone is called once when the request ends, where OnToken is: the request's error (nil
	// on success), the stop reason and the number of generated tokens. It must not panic.
	OnDone func(err error, reason StopReason, nTokens int32)
}

// Submit starts req and returns at once; it runs as the cache is stepped (Cache.Step, the
// worker, or a blocking call on the same cache). Until Poll reports done, other calls on the
// session fail with ErrBusy.
func (s *Session) Submit(req Request) error {
	if s.ptr == nil {
		return closedError("session")
	}
	var p C.kiln_request_params
	C.kiln_request_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	ctext, clen := cText(req.Text)
	defer C.free(unsafe.Pointer(ctext))
	p.text, p.text_len = ctext, clen
	p.text_flags = TokenizeOptions{AddSpecial: req.AddSpecial, ParseSpecial: req.ParseSpecial}.flags()
	// The prompt is read during the call; C memory because p is Go memory holding the pointer.
	var ctokens *C.int32_t
	if len(req.Tokens) > 0 {
		ctokens = (*C.int32_t)(C.CBytes(unsafe.Slice((*byte)(unsafe.Pointer(&req.Tokens[0])), 4*len(req.Tokens))))
		defer C.free(unsafe.Pointer(ctokens))
	}
	p.tokens, p.n_tokens = ctokens, C.size_t(len(req.Tokens))
	p.max_tokens = C.int32_t(req.MaxTokens)
	// Stop strings are matched while the request runs: they live until the next submit or Close.
	stops := cStrings(req.Stop)
	p.stop_strings, p.n_stop_strings = stops, C.size_t(len(req.Stop))
	var handle cgo.Handle
	if req.OnToken != nil || req.OnDone != nil {
		state := &requestState{onToken: req.OnToken, onDone: req.OnDone}
		handle = cgo.NewHandle(state)
		C.kiln_go_set_request_callbacks(&p, boolInt(req.OnToken != nil), boolInt(req.OnDone != nil), C.uintptr_t(handle))
	}
	if err := call(func() C.kiln_status { return C.kiln_session_submit(s.ptr, &p) }); err != nil {
		freeCStrings(stops, len(req.Stop))
		if handle != 0 {
			handle.Delete()
		}
		return err
	}
	s.freeRequestData()
	s.requestStops, s.nRequestStops = stops, len(req.Stop)
	s.requestCallbacks = handle
	return nil
}

// PollResult is the output of the request since the last Poll.
type PollResult struct {
	Text       []byte  // may end inside a UTF-8 character; the next poll continues it
	Tokens     []int32 // generated token ids
	Done       bool
	Err        error      // when Done: the request's error, or nil
	StopReason StopReason // when Done without Err
	NTokens    int32      // tokens generated so far
}

// Poll moves the request's new output out; never blocks on a step. Any goroutine, any time.
func (s *Session) Poll() (PollResult, error) {
	if s.ptr == nil {
		return PollResult{}, closedError("session")
	}
	var out PollResult
	text := make([]byte, 4096)
	tokens := make([]int32, 256)
	for {
		var r C.kiln_poll_result
		r.struct_size = C.uint32_t(unsafe.Sizeof(r))
		var requestErr error
		err := call(func() C.kiln_status {
			status := C.kiln_session_poll(s.ptr, (*C.char)(unsafe.Pointer(&text[0])), C.size_t(len(text)),
				tokenPtr(tokens), C.size_t(len(tokens)), &r)
			if status == C.KILN_OK && r.done != 0 && r.status != C.KILN_OK {
				// The message is this thread's, as for a failed call.
				requestErr = &Error{Status: Status(r.status), Message: C.GoString(C.kiln_last_error_message())}
			}
			return status
		})
		if err != nil {
			return PollResult{}, err
		}
		out.Text = append(out.Text, text[:r.text_len]...)
		out.Tokens = append(out.Tokens, tokens[:r.n_new_tokens]...)
		out.NTokens = int32(r.n_tokens)
		if r.text_left == 0 && r.tokens_left == 0 {
			out.Done = r.done != 0
			out.Err = requestErr
			if out.Done && requestErr == nil {
				out.StopReason = StopReason(r.stop_reason)
			}
			return out, nil
		}
	}
}

// Wait polls until the request is done, with the cache stepped by someone else (the worker or
// another goroutine), collecting its output. Cancelling ctx cancels the request and waits for
// it to end.
func (s *Session) Wait(ctx context.Context, every time.Duration) (PollResult, error) {
	var all PollResult
	cancelled := false
	for {
		r, err := s.Poll()
		if err != nil {
			return all, err
		}
		all.Text = append(all.Text, r.Text...)
		all.Tokens = append(all.Tokens, r.Tokens...)
		all.NTokens = r.NTokens
		if r.Done {
			all.Done, all.Err, all.StopReason = true, r.Err, r.StopReason
			return all, nil
		}
		if ctx.Err() != nil && !cancelled {
			s.Cancel()
			cancelled = true
		}
		time.Sleep(every)
	}
}
