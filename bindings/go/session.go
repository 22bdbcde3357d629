package kiln

/*
#include <stdlib.h>
#include <kiln/kiln.h>

int kiln_go_token(int32_t token, const char* piece, size_t piece_len, void* user_data);

static void kiln_go_set_token_cb(kiln_generate_params* p, uintptr_t handle) {
  p->callback = kiln_go_token;
  p->user_data = (void*)handle;
}
*/
import "C"

import (
	"context"
	"errors"
	"runtime/cgo"
	"unsafe"
)

// SamplerOptions are a session's sampling parameters. The zero value is greedy decoding (kiln's
// own defaults sample at temperature 0.8; a Go zero value meaning "random" would surprise).
type SamplerOptions struct {
	Temperature      float32 // <= 0: greedy
	TopK             int32   // <= 0: off
	TopP             float32 // 0 or >= 1: off
	MinP             float32 // <= 0: off
	TypicalP         float32 // 0 or >= 1: off
	RepeatPenalty    float32 // 0 or 1: off
	FrequencyPenalty float32 // 0: off
	PresencePenalty  float32 // 0: off
	PenaltyLastN     int32   // window of the penalties; 0: kiln's 64, -1: the whole history
	Seed             uint64
	NLogprobs        int32 // top log-probabilities kept per sampled token
	// LogitBias is added to the logits of the tokens it names; float32(math.Inf(-1)) bans one.
	LogitBias map[int32]float32
}

// Session is one conversation on a cache; one goroutine at a time (Cancel and NTokens: any).
type Session struct {
	ptr   *C.kiln_session
	cache *Cache
	// stop strings of the request in flight, in C memory until the next submit or Close.
	requestStops  **C.char
	nRequestStops int
	// callbacks of the last submitted request (0: none), kept until the next submit or Close.
	requestCallbacks cgo.Handle
}

// NewSession creates an empty session; sampler nil is greedy.
func (c *Cache) NewSession(sampler *SamplerOptions) (*Session, error) {
	if c.ptr == nil {
		return nil, closedError("cache")
	}
	var cs *C.kiln_sampler
	if sampler != nil {
		var p C.kiln_sampler_params
		C.kiln_sampler_params_init(&p, C.size_t(unsafe.Sizeof(p)))
		p.temperature = C.float(sampler.Temperature)
		p.top_k = C.int32_t(sampler.TopK)
		p.top_p = 1
		if sampler.TopP > 0 {
			p.top_p = C.float(sampler.TopP)
		}
		p.min_p = C.float(sampler.MinP)
		p.typical_p = 1
		if sampler.TypicalP > 0 {
			p.typical_p = C.float(sampler.TypicalP)
		}
		p.repeat_penalty = 1
		if sampler.RepeatPenalty != 0 {
			p.repeat_penalty = C.float(sampler.RepeatPenalty)
		}
		p.frequency_penalty = C.float(sampler.FrequencyPenalty)
		p.presence_penalty = C.float(sampler.PresencePenalty)
		if sampler.PenaltyLastN != 0 {
			p.penalty_last_n = C.int32_t(sampler.PenaltyLastN)
		}
		p.seed = C.uint64_t(sampler.Seed)
		p.n_logprobs = C.int32_t(sampler.NLogprobs)
		if n := len(sampler.LogitBias); n > 0 {
			// C memory: p (Go memory) holds the pointer; kiln_sampler_create copies the array.
			bias := (*[1 << 20]C.kiln_logit_bias)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.kiln_logit_bias{}))))
			defer C.free(unsafe.Pointer(bias))
			i := 0
			for token, b := range sampler.LogitBias {
				bias[i] = C.kiln_logit_bias{token: C.int32_t(token), bias: C.float(b)}
				i++
			}
			p.logit_bias, p.n_logit_bias = &bias[0], C.size_t(n)
		}
		if err := call(func() C.kiln_status { return C.kiln_sampler_create(&p, &cs) }); err != nil {
			return nil, err
		}
		// The session copies the parameters.
		defer C.kiln_sampler_destroy(cs)
	}
	var ptr *C.kiln_session
	if err := call(func() C.kiln_status { return C.kiln_session_create(c.model.ptr, c.ptr, cs, &ptr) }); err != nil {
		return nil, err
	}
	return &Session{ptr: ptr, cache: c}, nil
}

// Close frees the session (cancelling a request in flight). Closing twice is a no-op.
func (s *Session) Close() {
	C.kiln_session_destroy(s.ptr)
	s.ptr = nil
	s.freeRequestData()
}

// freeRequestData frees what the last submitted request needed while it ran.
func (s *Session) freeRequestData() {
	freeCStrings(s.requestStops, s.nRequestStops)
	s.requestStops, s.nRequestStops = nil, 0
	if s.requestCallbacks != 0 {
		s.requestCallbacks.Delete()
		s.requestCallbacks = 0
	}
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// cStrings copies strs into a C array of C strings (kiln reads arrays of pointers, which cgo
// forbids in Go memory).
func cStrings(strs []string) **C.char {
	if len(strs) == 0 {
		return nil
	}
	arr := (*[1 << 20]*C.char)(C.calloc(C.size_t(len(strs)), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	for i, s := range strs {
		arr[i] = C.CString(s)
	}
	return &arr[0]
}

func freeCStrings(p **C.char, n int) {
	if p == nil {
		return
	}
	arr := (*[1 << 20]*C.char)(unsafe.Pointer(p))
	for i := 0; i < n; i++ {
		C.free(unsafe.Pointer(arr[i]))
	}
	C.free(unsafe.Pointer(p))
}

// withCancel runs f (a call on the session) with ctx's cancellation mapped to kiln_session_cancel.
func (s *Session) withCancel(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return &Error{Status: StatusCancelled, Message: "cancelled before the call: " + err.Error(), cause: err}
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			C.kiln_session_cancel(s.ptr)
		case <-done:
		}
	}()
	err := f()
	var e *Error
	if errors.As(err, &e) && e.Status == StatusCancelled && ctx.Err() != nil {
		e.cause = ctx.Err()
	}
	return err
}

// Append tokenizes text and appends it, computing it. All or nothing; cancelling ctx stops it
// (ErrCancelled) and leaves the session as it was.
func (s *Session) Append(ctx context.Context, text string, opts TokenizeOptions) error {
	if s.ptr == nil {
		return closedError("session")
	}
	ctext, clen := cText(text)
	defer C.free(unsafe.Pointer(ctext))
	return s.withCancel(ctx, func() error {
		return call(func() C.kiln_status { return C.kiln_session_append_text(s.ptr, ctext, clen, opts.flags()) })
	})
}

// AppendTokens appends token ids, like Append.
func (s *Session) AppendTokens(ctx context.Context, tokens []int32) error {
	if s.ptr == nil {
		return closedError("session")
	}
	return s.withCancel(ctx, func() error {
		return call(func() C.kiln_status {
			return C.kiln_session_append_tokens(s.ptr, tokenPtr(tokens), C.size_t(len(tokens)))
		})
	})
}

// StopReason says why a generate ended.
type StopReason int

const (
	StopEOG         StopReason = C.KILN_STOP_EOG
	StopMaxTokens   StopReason = C.KILN_STOP_MAX_TOKENS
	StopString      StopReason = C.KILN_STOP_STRING
	StopCallback    StopReason = C.KILN_STOP_CALLBACK
	StopCancelled   StopReason = C.KILN_STOP_CANCELLED
	StopContextFull StopReason = C.KILN_STOP_CONTEXT_FULL
)

func (r StopReason) String() string {
	return [...]string{"eog", "max_tokens", "string", "callback", "cancelled", "context_full"}[r]
}

// GenerateOptions are the optional parts of Generate.
type GenerateOptions struct {
	Stop []string // stop strings, never emitted
	// OnToken receives each token and the text it completed (possibly empty or a partial UTF-8
	// character; token -1 carries held-back text at the end). Returning false stops the generate.
	OnToken func(token int32, piece string) bool
}

// GenerateResult is what Generate made; the tokens stay in the session.
type GenerateResult struct {
	Tokens     []int32
	Text       string
	StopReason StopReason
}

type generateState struct {
	ctx               context.Context
	onToken           func(int32, string) bool
	text              []byte
	tokens            []int32
	stoppedByCallback bool
}

// Generate generates up to maxTokens tokens, streaming them to opts.OnToken. Cancelling ctx
// stops it at the next token: the result so far is returned with StopCancelled and an error that
// matches both ErrCancelled and ctx.Err().
func (s *Session) Generate(ctx context.Context, maxTokens int, opts *GenerateOptions) (GenerateResult, error) {
	if s.ptr == nil {
		return GenerateResult{}, closedError("session")
	}
	if opts == nil {
		opts = &GenerateOptions{}
	}
	state := &generateState{ctx: ctx, onToken: opts.OnToken}
	handle := cgo.NewHandle(state)
	defer handle.Delete()
	var params C.kiln_generate_params
	C.kiln_generate_params_init(&params, C.size_t(unsafe.Sizeof(params)))
	params.max_tokens = C.int32_t(maxTokens)
	stops := cStrings(opts.Stop)
	defer freeCStrings(stops, len(opts.Stop))
	params.stop_strings = stops
	params.n_stop_strings = C.size_t(len(opts.Stop))
	C.kiln_go_set_token_cb(&params, C.uintptr_t(handle))
	var result C.kiln_generate_result
	result.struct_size = C.uint32_t(unsafe.Sizeof(result))
	err := s.withCancel(ctx, func() error {
		return call(func() C.kiln_status { return C.kiln_session_generate(s.ptr, &params, &result) })
	})
	out := GenerateResult{Tokens: state.tokens, Text: string(state.text)}
	if err != nil {
		return out, err
	}
	out.StopReason = StopReason(result.stop_reason)
	if ctx.Err() != nil && !state.stoppedByCallback &&
		(out.StopReason == StopCancelled || out.StopReason == StopCallback) {
		// The callback also stops on a done context, which covers a cancel that reached kiln
		// before the generate started (kiln drops those).
		out.StopReason = StopCancelled
		return out, &Error{Status: StatusCancelled, Message: "generate cancelled: " + ctx.Err().Error(), cause: ctx.Err()}
	}
	return out, nil
}

// Stream generates like Generate, sending each non-empty piece of text on the returned channel,
// which is closed at the end; then the result and error arrive on the second channel. Cancel ctx
// to stop early; the caller must drain pieces (or cancel) so the generate can go on.
func (s *Session) Stream(ctx context.Context, maxTokens int, stop []string) (<-chan string, <-chan StreamEnd) {
	pieces := make(chan string, 16)
	end := make(chan StreamEnd, 1)
	go func() {
		defer close(end)
		result, err := s.Generate(ctx, maxTokens, &GenerateOptions{Stop: stop, OnToken: func(_ int32, piece string) bool {
			if piece == "" {
				return true
			}
			select {
			case pieces <- piece:
				return true
			case <-ctx.Done():
				// Not false (a callback stop): the done context stops the generate at the
				// next token and is reported as the cancel it is.
				return true
			}
		}})
		close(pieces)
		end <- StreamEnd{result, err}
	}()
	return pieces, end
}

// StreamEnd is how a Stream ended.
type StreamEnd struct {
	Result GenerateResult
	Err    error
}

// Cancel stops the call or request in flight on the session; any goroutine, any time.
func (s *Session) Cancel() { C.kiln_session_cancel(s.ptr) }

// NTokens is the number of tokens the session holds; any goroutine, any time.
func (s *Session) NTokens() int { return int(C.kiln_session_n_tokens(s.ptr)) }

// Fork makes an independent session with the same tokens (sharing cache blocks copy-on-write).
func (s *Session) Fork() (*Session, error) {
	if s.ptr == nil {
		return nil, closedError("session")
	}
	var ptr *C.kiln_session
	if err := call(func() C.kiln_status { return C.kiln_session_fork(s.ptr, &ptr) }); err != nil {
		return nil, err
	}
	return &Session{ptr: ptr, cache: s.cache}, nil
}

// Rewind removes the last n tokens.
func (s *Session) Rewind(n int) error {
	if s.ptr == nil {
		return closedError("session")
	}
	if n < 0 {
		return &Error{Status: StatusInvalidArgument, Message: "rewind: negative token count"}
	}
	return call(func() C.kiln_status { return C.kiln_session_rewind(s.ptr, C.size_t(n)) })
}

// Tokens returns the session's tokens.
func (s *Session) Tokens() ([]int32, error) {
	if s.ptr == nil {
		return nil, closedError("session")
	}
	tokens := make([]int32, s.NTokens()+1)
	var n C.size_t
	err := call(func() C.kiln_status {
		return C.kiln_session_get_tokens(s.ptr, tokenPtr(tokens), C.size_t(len(tokens)), &n)
	})
	if err != nil {
		return nil, err
	}
	return tokens[:n], nil
}

// Logits returns a copy of the next-token logits [n_vocab].
func (s *Session) Logits() ([]float32, error) {
	var p *C.float
	var n C.int32_t
	if err := call(func() C.kiln_status { return C.kiln_session_get_logits(s.ptr, &p, &n) }); err != nil {
		return nil, err
	}
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), int(n))...), nil
}

// TokenLogprob is one entry of Logprobs.
type TokenLogprob struct {
	Token   int32
	Logprob float32 // natural log of the raw probability
}

// Logprobs are the top log-probabilities (highest first) of the last sampled token's
// distribution (SamplerOptions.NLogprobs entries).
func (s *Session) Logprobs() ([]TokenLogprob, error) {
	out := make([]C.kiln_token_logprob, 64)
	var n C.size_t
	for {
		err := call(func() C.kiln_status {
			return C.kiln_session_get_logprobs(s.ptr, &out[0], C.size_t(len(out)), &n)
		})
		if errors.Is(err, ErrBufferTooSmall) {
			out = make([]C.kiln_token_logprob, n)
			continue
		}
		if err != nil {
			return nil, err
		}
		result := make([]TokenLogprob, n)
		for i := range result {
			result[i] = TokenLogprob{int32(out[i].token), float32(out[i].logprob)}
		}
		return result, nil
	}
}

// StateOptions are the optional parts of a saved state; the zero value saves everything.
type StateOptions struct {
	// NoKV saves only the tokens (a few bytes per token); the restore recomputes the K/V.
	NoKV bool
	// NoStrategy leaves the speculative strategy's adaptive state out (a draft model cannot save
	// it: ErrUnsupported otherwise).
	NoStrategy bool
}

func (o StateOptions) params() C.kiln_state_params {
	var p C.kiln_state_params
	C.kiln_state_params_init(&p, C.size_t(unsafe.Sizeof(p)))
	if o.NoKV {
		p.kv = 0
	}
	if o.NoStrategy {
		p.strategy = 0
	}
	return p
}

// SaveState serializes the session (tokens, K/V, logits, sampler and strategy state).
func (s *Session) SaveState() ([]byte, error) { return s.SaveStateWith(StateOptions{}) }

// SaveStateWith serializes the session as opts asks.
func (s *Session) SaveStateWith(opts StateOptions) ([]byte, error) {
	if s.ptr == nil {
		return nil, closedError("session")
	}
	params := opts.params()
	var n C.size_t
	err := call(func() C.kiln_status { return C.kiln_session_save_state(s.ptr, &params, nil, 0, &n) })
	if err != nil && !errors.Is(err, ErrBufferTooSmall) {
		return nil, err
	}
	buf := make([]byte, n)
	err = call(func() C.kiln_status {
		return C.kiln_session_save_state(s.ptr, &params, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), &n)
	})
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// LoadState replaces the session's contents with a saved state; all or nothing.
func (s *Session) LoadState(state []byte) error {
	if len(state) == 0 {
		return &Error{Status: StatusFormat, Message: "load state: empty state"}
	}
	return call(func() C.kiln_status {
		return C.kiln_session_load_state(s.ptr, unsafe.Pointer(&state[0]), C.size_t(len(state)))
	})
}

// SaveStateFile saves the session's state into the file at path (written beside it, then renamed
// over it).
func (s *Session) SaveStateFile(path string, opts StateOptions) error {
	if s.ptr == nil {
		return closedError("session")
	}
	params := opts.params()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return call(func() C.kiln_status { return C.kiln_session_save_state_file(s.ptr, &params, cpath) })
}

// LoadStateFile replaces the session's contents with the state saved in the file at path.
func (s *Session) LoadStateFile(path string) error {
	if s.ptr == nil {
		return closedError("session")
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return call(func() C.kiln_status { return C.kiln_session_load_state_file(s.ptr, cpath) })
}

// Score appends tokens (at least 2) and returns the natural log-probability of each token after
// the first given what precedes it (perplexity scoring).
func (s *Session) Score(tokens []int32) ([]float32, error) {
	if s.ptr == nil {
		return nil, closedError("session")
	}
	if len(tokens) < 2 {
		return nil, &Error{Status: StatusInvalidArgument, Message: "score: fewer than 2 tokens"}
	}
	out := make([]float32, len(tokens)-1)
	err := call(func() C.kiln_status {
		return C.kiln_session_append_tokens_scored(s.ptr, tokenPtr(tokens), C.size_t(len(tokens)),
			(*C.float)(unsafe.Pointer(&out[0])))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
