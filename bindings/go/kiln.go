// Package kiln is the Go binding of kiln, an embeddable LLM inference library (include/kiln/kiln.h).
//
// Handles (Model, Cache, Session, Strategy) wrap the C handles and must be closed, sessions before
// their cache and caches before their model. Errors are *Error values carrying the kiln status and
// message; compare them with errors.Is against the Err* sentinels. Long calls take a
// context.Context whose cancellation is mapped to kiln's cancel.
//
// Threading follows the C contract: a Model and a Cache may be used from any number of goroutines,
// a Session from one at a time (a second concurrent call fails with ErrBusy), except Cancel,
// NTokens and Poll, which any goroutine may call at any time.
package kiln

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -lkiln
#include <stdlib.h>
#include <kiln/kiln.h>

int kiln_go_progress(float progress, void* user_data);
void kiln_go_log(kiln_log_level level, const char* message, void* user_data);

// The callbacks' user_data is a cgo.Handle (an integer), set here so Go never forms a pointer
// from it.
static void kiln_go_set_progress(kiln_model_params* p, uintptr_t handle) {
  p->progress = kiln_go_progress;
  p->progress_user_data = (void*)handle;
}

static void kiln_go_set_log(kiln_model_params* p, uintptr_t handle) {
  p->log = kiln_go_log;
  p->log_user_data = (void*)handle;
}
*/
import "C"

import (
	"context"
	"errors"
	"runtime"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// Status is a kiln_status.
type Status int

const (
	StatusOK              Status = C.KILN_OK
	StatusInvalidArgument Status = C.KILN_ERR_INVALID_ARGUMENT
	StatusIO              Status = C.KILN_ERR_IO
	StatusFormat          Status = C.KILN_ERR_FORMAT
	StatusUnsupported     Status = C.KILN_ERR_UNSUPPORTED
	StatusOutOfMemory     Status = C.KILN_ERR_OUT_OF_MEMORY
	StatusCacheFull       Status = C.KILN_ERR_CACHE_FULL
	StatusCancelled       Status = C.KILN_ERR_CANCELLED
	StatusOutOfRange      Status = C.KILN_ERR_OUT_OF_RANGE
	StatusBufferTooSmall  Status = C.KILN_ERR_BUFFER_TOO_SMALL
	StatusBusy            Status = C.KILN_ERR_BUSY
	StatusInternal        Status = C.KILN_ERR_INTERNAL
)

// String is the status's C name, e.g. "KILN_ERR_FORMAT".
func (s Status) String() string { return C.GoString(C.kiln_status_name(C.kiln_status(s))) }

// Error is a failed kiln call: its status and kiln's message for it. errors.Is(err, ErrIO) and
// the like match on the status; a cancellation caused by a context also matches the context's
// error (errors.Is(err, context.Canceled)).
type Error struct {
	Status  Status
	Message string
	cause   error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Status.String()
	}
	return e.Status.String() + ": " + e.Message
}

// Is matches a sentinel (an *Error without a message) of the same status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Status == e.Status
}

func (e *Error) Unwrap() error { return e.cause }

// Sentinels for errors.Is, one per status.
var (
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrIO              = &Error{Status: StatusIO}
	ErrFormat          = &Error{Status: StatusFormat}
	ErrUnsupported     = &Error{Status: StatusUnsupported}
	ErrOutOfMemory     = &Error{Status: StatusOutOfMemory}
	ErrCacheFull       = &Error{Status: StatusCacheFull}
	ErrCancelled       = &Error{Status: StatusCancelled}
	ErrOutOfRange      = &Error{Status: StatusOutOfRange}
	ErrBufferTooSmall  = &Error{Status: StatusBufferTooSmall}
	ErrBusy            = &Error{Status: StatusBusy}
	ErrInternal        = &Error{Status: StatusInternal}
)

// call runs one kiln call and turns a failure into an *Error. The message is per OS thread in
// kiln, so the goroutine stays on its thread from the call to the read of the message.
func call(f func() C.kiln_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if status := f(); status != C.KILN_OK {
		return &Error{Status: Status(status), Message: C.GoString(C.kiln_last_error_message())}
	}
	return nil
}

func closedError(what string) error {
	return &Error{Status: StatusInvalidArgument, Message: what + " is closed"}
}

// Version is the loaded library's "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.kiln_version()) }

// ABIVersion is the loaded library's ABI version (the SONAME suffix).
func ABIVersion() int { return int(C.kiln_abi_version()) }

// CPUInfo names the CPU kernels in use and the CPU's features.
func CPUInfo() string { return C.GoString(C.kiln_cpu_info()) }

// Backends lists the compute backends this process can use, one per line.
func Backends() string { return C.GoString(C.kiln_backends()) }

// ---------------------------------------------------------------- model

// Model is a loaded GGUF model; immutable, usable from any goroutine.
type Model struct {
	ptr *C.kiln_model
}

// LogLevel is the severity of a log line (kiln_log_level).
type LogLevel int

const (
	LogDebug LogLevel = C.KILN_LOG_DEBUG
	LogInfo  LogLevel = C.KILN_LOG_INFO
	LogWarn  LogLevel = C.KILN_LOG_WARN
	LogError LogLevel = C.KILN_LOG_ERROR
)

// LoadOptions are the optional parts of LoadModel.
type LoadOptions struct {
	// Progress receives the progress in [0, 1]; returning false cancels the load (ErrCancelled).
	Progress func(progress float32) bool
	// Log receives the load's log lines, on the loading goroutine (a failed load logs its error
	// message at LogError).
	Log func(level LogLevel, line string)
	// NoMmap reads the file into memory instead of mapping it.
	NoMmap bool
}

type loadState struct {
	ctx      context.Context
	progress func(float32) bool
	log      func(LogLevel, string)
}

// LoadModel loads the GGUF file at path. Cancelling ctx cancels the load (an *Error that matches
// both ErrCancelled and the context's error).
func LoadModel(ctx context.Context, path string, opts *LoadOptions) (*Model, error) {
	if opts == nil {
		opts = &LoadOptions{}
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Status: StatusCancelled, Message: "load cancelled: " + err.Error(), cause: err}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var params C.kiln_model_params
	C.kiln_model_params_init(&params, C.size_t(unsafe.Sizeof(params)))
	params.path = cpath
	if opts.NoMmap {
		params.use_mmap = 0
	}
	handle := cgo.NewHandle(&loadState{ctx: ctx, progress: opts.Progress, log: opts.Log})
	defer handle.Delete()
	C.kiln_go_set_progress(&params, C.uintptr_t(handle))
	if opts.Log != nil {
		C.kiln_go_set_log(&params, C.uintptr_t(handle))
	}
	var ptr *C.kiln_model
	err := call(func() C.kiln_status { return C.kiln_model_load(&params, &ptr) })
	if err != nil {
		if e := err.(*Error); e.Status == StatusCancelled && ctx.Err() != nil {
			e.cause = ctx.Err()
		}
		return nil, err
	}
	return &Model{ptr: ptr}, nil
}

// Close frees the model; every cache on it must be closed first. Closing twice is a no-op.
func (m *Model) Close() {
	C.kiln_model_destroy(m.ptr)
	m.ptr = nil
}

// ModelInfo describes a loaded model.
type ModelInfo struct {
	Architecture, Name                               string
	NParams, SizeBytes                               int64
	NVocab, NCtxTrain, NEmbd, NLayer, NHead, NHeadKV int32
	HeadDim, NFF, TokenBOS, TokenEOS, TokenEOT       int32
}

// Info describes the model.
func (m *Model) Info() (ModelInfo, error) {
	if m.ptr == nil {
		return ModelInfo{}, closedError("model")
	}
	var info C.kiln_model_info
	info.struct_size = C.uint32_t(unsafe.Sizeof(info))
	if err := call(func() C.kiln_status { return C.kiln_model_get_info(m.ptr, &info) }); err != nil {
		return ModelInfo{}, err
	}
	return ModelInfo{
		Architecture: C.GoString(info.architecture), Name: C.GoString(info.name),
		NParams: int64(info.n_params), SizeBytes: int64(info.size_bytes),
		NVocab: int32(info.n_vocab), NCtxTrain: int32(info.n_ctx_train), NEmbd: int32(info.n_embd),
		NLayer: int32(info.n_layer), NHead: int32(info.n_head), NHeadKV: int32(info.n_head_kv),
		HeadDim: int32(info.head_dim), NFF: int32(info.n_ff), TokenBOS: int32(info.token_bos),
		TokenEOS: int32(info.token_eos), TokenEOT: int32(info.token_eot),
	}, nil
}

// Meta is the metadata value of key rendered as text; ok is false when the key is absent.
func (m *Model) Meta(key string) (value string, ok bool) {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	var cvalue *C.char
	if C.kiln_model_meta_get(m.ptr, ckey, &cvalue) != C.KILN_OK {
		return "", false
	}
	return C.GoString(cvalue), true
}

// MetaEntry is one metadata entry, its value rendered as text (arrays shortened).
type MetaEntry struct {
	Key, Value string
}

// metaEntries reads n entries through at (kiln_model_meta_at or kiln_gguf_meta_at).
func metaEntries(n C.size_t, at func(i C.size_t, key, value **C.char) C.kiln_status) ([]MetaEntry, error) {
	entries := make([]MetaEntry, 0, int(n))
	for i := C.size_t(0); i < n; i++ {
		var key, value *C.char
		if err := call(func() C.kiln_status { return at(i, &key, &value) }); err != nil {
			return nil, err
		}
		entries = append(entries, MetaEntry{C.GoString(key), C.GoString(value)})
	}
	return entries, nil
}

// Metadata lists every GGUF metadata entry in file order.
func (m *Model) Metadata() ([]MetaEntry, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	return metaEntries(C.kiln_model_meta_count(m.ptr), func(i C.size_t, key, value **C.char) C.kiln_status {
		return C.kiln_model_meta_at(m.ptr, i, key, value)
	})
}

// IsEOG reports whether token ends generation.
func (m *Model) IsEOG(token int32) bool {
	return C.kiln_model_token_is_eog(m.ptr, C.int32_t(token)) != 0
}

// TokenizeOptions are kiln_tokenize's flags.
type TokenizeOptions struct {
	AddSpecial   bool // add BOS/EOS as the vocabulary asks
	ParseSpecial bool // "<|im_start|>" in the text becomes the control token
}

func (o TokenizeOptions) flags() C.uint32_t {
	var f C.uint32_t
	if o.AddSpecial {
		f |= C.KILN_TOKENIZE_ADD_SPECIAL
	}
	if o.ParseSpecial {
		f |= C.KILN_TOKENIZE_PARSE_SPECIAL
	}
	return f
}

// cText is text as (pointer, length) in C memory; free it with C.free (nil for "").
func cText(text string) (*C.char, C.size_t) {
	if text == "" {
		return nil, 0
	}
	return (*C.char)(C.CBytes([]byte(text))), C.size_t(len(text))
}

func tokenPtr(tokens []int32) *C.int32_t {
	if len(tokens) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&tokens[0]))
}

// Tokenize turns text into token ids.
func (m *Model) Tokenize(text string, opts TokenizeOptions) ([]int32, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	ctext, clen := cText(text)
	defer C.free(unsafe.Pointer(ctext))
	tokens := make([]int32, len(text)+8)
	for {
		var n C.size_t
		err := call(func() C.kiln_status {
			return C.kiln_tokenize(m.ptr, ctext, clen, opts.flags(), tokenPtr(tokens), C.size_t(len(tokens)), &n)
		})
		if errors.Is(err, ErrBufferTooSmall) {
			tokens = make([]int32, n)
			continue
		}
		if err != nil {
			return nil, err
		}
		return tokens[:n], nil
	}
}

// Detokenize concatenates the tokens' bytes; renderSpecial renders control tokens as their text.
func (m *Model) Detokenize(tokens []int32, renderSpecial bool) (string, error) {
	if m.ptr == nil {
		return "", closedError("model")
	}
	var flags C.uint32_t
	if renderSpecial {
		flags = C.KILN_DETOKENIZE_RENDER_SPECIAL
	}
	buf := make([]byte, 16*len(tokens)+16)
	for {
		var n C.size_t
		err := call(func() C.kiln_status {
			return C.kiln_detokenize(m.ptr, tokenPtr(tokens), C.size_t(len(tokens)), flags,
				(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		})
		if errors.Is(err, ErrBufferTooSmall) {
			buf = make([]byte, n+1)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// ChatMessage is one message of a conversation; Role is "system", "user" or "assistant".
type ChatMessage struct {
	Role, Content string
}

// ApplyChatTemplate renders messages with a chat template: template "" is the model's own, else
// a Jinja source of a known family or a family name ("chatml", "llama3", ...).
func (m *Model) ApplyChatTemplate(messages []ChatMessage, template string, addGenerationPrompt bool) (string, error) {
	if m.ptr == nil {
		return "", closedError("model")
	}
	// C memory throughout: kiln reads an array of pointers, which cgo forbids in Go memory.
	cmsgs := (*[1 << 20]C.kiln_chat_message)(C.calloc(C.size_t(len(messages)+1), C.size_t(unsafe.Sizeof(C.kiln_chat_message{}))))
	defer C.free(unsafe.Pointer(cmsgs))
	for i, msg := range messages {
		cmsgs[i].role = C.CString(msg.Role)
		cmsgs[i].content = C.CString(msg.Content)
		defer C.free(unsafe.Pointer(cmsgs[i].role))
		defer C.free(unsafe.Pointer(cmsgs[i].content))
	}
	var ctmpl *C.char
	if template != "" {
		ctmpl = C.CString(template)
		defer C.free(unsafe.Pointer(ctmpl))
	}
	var addPrompt C.int
	if addGenerationPrompt {
		addPrompt = 1
	}
	buf := make([]byte, 1024)
	for {
		var n C.size_t
		err := call(func() C.kiln_status {
			return C.kiln_chat_apply_template(m.ptr, ctmpl, &cmsgs[0], C.size_t(len(messages)), addPrompt,
				(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		})
		if errors.Is(err, ErrBufferTooSmall) {
			buf = make([]byte, n+1)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// ---------------------------------------------------------------- inspecting a file

// GGUFFile is a GGUF file opened for inspection only: its metadata and what kiln lacks to run it.
// It works for any valid GGUF, also one of an architecture kiln cannot load.
type GGUFFile struct {
	ptr *C.kiln_gguf
}

// OpenGGUF opens and validates the file at path: ErrIO when it cannot be read, ErrFormat when it
// is not a valid GGUF (the message names the field and byte offset).
func OpenGGUF(path string) (*GGUFFile, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var ptr *C.kiln_gguf
	if err := call(func() C.kiln_status { return C.kiln_gguf_open(cpath, &ptr) }); err != nil {
		return nil, err
	}
	return &GGUFFile{ptr: ptr}, nil
}

// Close frees the handle. Closing twice is a no-op.
func (g *GGUFFile) Close() {
	C.kiln_gguf_destroy(g.ptr)
	g.ptr = nil
}

// Metadata lists every metadata entry in file order.
func (g *GGUFFile) Metadata() ([]MetaEntry, error) {
	if g.ptr == nil {
		return nil, closedError("GGUF file")
	}
	return metaEntries(C.kiln_gguf_meta_count(g.ptr), func(i C.size_t, key, value **C.char) C.kiln_status {
		return C.kiln_gguf_meta_at(g.ptr, i, key, value)
	})
}

// Unsupported lists what kiln lacks to run the file, one problem per entry; empty when it can.
func (g *GGUFFile) Unsupported() []string {
	text := strings.TrimRight(C.GoString(C.kiln_gguf_unsupported(g.ptr)), "\n")
	if text == "" {
		return nil
	}
	return strings.Split(text, "\n")
}

// ---------------------------------------------------------------- cache

// Cache is a paged KV cache and the engine that batches its sessions; any goroutine may use it.
type Cache struct {
	ptr   *C.kiln_cache
	model *Model
}

// KVType is the element type of the stored K/V (kiln_kv_type).
type KVType int

const (
	KVF16  KVType = C.KILN_KV_F16
	KVF32  KVType = C.KILN_KV_F32
	KVBF16 KVType = C.KILN_KV_BF16
	KVQ8_0 KVType = C.KILN_KV_Q8_0 // the model's head size must be a multiple of 32
)

// Backend is the compute backend a cache asks for (kiln_backend_kind).
type Backend int

const (
	BackendCPU  Backend = C.KILN_BACKEND_CPU
	BackendCUDA Backend = C.KILN_BACKEND_CUDA
	BackendAuto Backend = C.KILN_BACKEND_AUTO // CUDA when it can run the model, else the CPU
)

// MLAPrefill is how MLA models (deepseek2) compute prompt chunks (kiln_mla_prefill); other
// models ignore it.
type MLAPrefill int

const (
	// MLAPrefillAbsorbed computes prompts as decode steps: every bitwise guarantee holds.
	MLAPrefillAbsorbed MLAPrefill = C.KILN_MLA_PREFILL_ABSORBED
	// MLAPrefillMeasured decompresses long chunks where a measured cost rule says it is faster;
	// equal to float rounding, so a token's last logit bits can depend on the chunking.
	MLAPrefillMeasured MLAPrefill = C.KILN_MLA_PREFILL_MEASURED
)

// CacheOptions are the optional parts of NewCache; zero values keep kiln's defaults.
type CacheOptions struct {
	NCtx            int32  // most tokens one session may hold; 0: the training context
	BlockSize       int32  // tokens per block; 0: 16
	PoolBytes       uint64 // KV pool size; 0: one full context
	NThreads        int32  // compute threads; 0: physical cores
	NoPrefixCaching bool
	KVType          KVType
	LlamaCppOrder   bool  // reproduce llama.cpp's CPU arithmetic bit for bit (slower)
	StepTokens      int32 // most tokens in one step's forward pass; 0: 512
	// Backend CUDA or Auto runs on the CUDA device CUDADevice when it can, else on the CPU (the
	// cache is created either way; Cache.Backend says which and why).
	Backend    Backend
	CUDADevice int32
	MLAPrefill MLAPrefill
	// SwaFull: models with sliding-window and global layers (gemma3), CPU backend; false releases
	// the sliding layers' K/V once every window has left it, back to the pool, true keeps every
	// layer's K/V.
	SwaFull bool
	// PinThreads: CPU backend, each worker thread on a core of its own (for hosts that step the
	// cache in short bursts, such as a game loop).
	PinThreads bool
}

// NewCache creates a cache on the model; close it before the model.
func (m *Model) NewCache(opts *CacheOptions) (*Cache, error) {
	if m.ptr == nil {
		return nil, closedError("model")
	}
	if opts == nil {
		opts = &CacheOptions{}
	}
	var params C.kiln_cache_params
	C.kiln_cache_params_init(&params, C.size_t(unsafe.Sizeof(params)))
	params.n_ctx = C.int32_t(opts.NCtx)
	if opts.BlockSize != 0 {
		params.block_size = C.int32_t(opts.BlockSize)
	}
	params.pool_bytes = C.size_t(opts.PoolBytes)
	params.n_threads = C.int32_t(opts.NThreads)
	if opts.NoPrefixCaching {
		params.prefix_caching = 0
	}
	params.kv_type = C.kiln_kv_type(opts.KVType)
	if opts.LlamaCppOrder {
		params.llama_cpp_order = 1
	}
	if opts.StepTokens != 0 {
		params.step_tokens = C.int32_t(opts.StepTokens)
	}
	params.backend = C.kiln_backend_kind(opts.Backend)
	params.cuda_device = C.int32_t(opts.CUDADevice)
	params.mla_prefill = C.kiln_mla_prefill(opts.MLAPrefill)
	if opts.SwaFull {
		params.swa_full = 1
	}
	if opts.PinThreads {
		params.pin_threads = 1
	}
	var ptr *C.kiln_cache
	if err := call(func() C.kiln_status { return C.kiln_cache_create(m.ptr, &params, &ptr) }); err != nil {
		return nil, err
	}
	return &Cache{ptr: ptr, model: m}, nil
}

// Close frees the cache (stopping its worker); its sessions must be closed first.
func (c *Cache) Close() {
	C.kiln_cache_destroy(c.ptr)
	c.ptr = nil
}

// Backend names the backend the cache runs on ("cpu (avx2, 4 threads)"), followed by "; cuda
// requested, running on the CPU: <reason>" when a CUDA request fell back.
func (c *Cache) Backend() string { return C.GoString(C.kiln_cache_backend(c.ptr)) }

// CacheStats are the cache's occupancy and prefix-cache counters.
type CacheStats struct {
	NCtx, BlockSize, BlocksTotal, BlocksFree, BlocksUsed, BlocksCached, NSequences int32
	PrefixLookups, PrefixQueryTokens, PrefixHitTokens, Evictions                   int64
	BytesPerToken, BlockBytes                                                      uint64
	// K/V bytes held by sessions now, and the sliding-window layers' blocks (SwaFull false; zero
	// otherwise): 0 (they share the pool), those held (part of BlocksUsed), those released so far
	// because every window had left them, and BlockBytes.
	KVBytesInUse                          uint64
	SlidingBlocksTotal, SlidingBlocksUsed int32
	SlidingBlocksReleased                 int64
	SlidingBlockBytes                     uint64
}

// Stats reads the cache's counters.
func (c *Cache) Stats() (CacheStats, error) {
	var s C.kiln_cache_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	if err := call(func() C.kiln_status { return C.kiln_cache_get_stats(c.ptr, &s) }); err != nil {
		return CacheStats{}, err
	}
	return CacheStats{
		NCtx: int32(s.n_ctx), BlockSize: int32(s.block_size), BlocksTotal: int32(s.blocks_total),
		BlocksFree: int32(s.blocks_free), BlocksUsed: int32(s.blocks_used),
		BlocksCached: int32(s.blocks_cached), NSequences: int32(s.n_sequences),
		PrefixLookups: int64(s.prefix_lookups), PrefixQueryTokens: int64(s.prefix_query_tokens),
		PrefixHitTokens: int64(s.prefix_hit_tokens), Evictions: int64(s.evictions),
		BytesPerToken: uint64(s.bytes_per_token), BlockBytes: uint64(s.block_bytes),
		KVBytesInUse:       uint64(s.kv_bytes_in_use),
		SlidingBlocksTotal: int32(s.sliding_blocks_total), SlidingBlocksUsed: int32(s.sliding_blocks_used),
		SlidingBlocksReleased: int64(s.sliding_blocks_released),
		SlidingBlockBytes:     uint64(s.sliding_block_bytes),
	}, nil
}

// StepResult reports what Step ran.
type StepResult struct {
	NSteps    int32   // forward passes run
	NTokens   int64   // tokens they computed
	NActive   int32   // requests still in flight
	ElapsedMs float64 // time spent
}

// Step runs steps of the cache on the calling goroutine: one step, or with timeBudgetMs > 0 as
// many as are expected to end within that budget (a game loop calls it once per frame).
func (c *Cache) Step(timeBudgetMs float64) (StepResult, error) {
	return c.StepWith(timeBudgetMs, 0)
}

// StepWith is Step with at most stepTokens tokens per forward pass (0: the cache's StepTokens).
func (c *Cache) StepWith(timeBudgetMs float64, stepTokens int32) (StepResult, error) {
	var params C.kiln_step_params
	C.kiln_step_params_init(&params, C.size_t(unsafe.Sizeof(params)))
	params.time_budget_ms = C.double(timeBudgetMs)
	params.step_tokens = C.int32_t(stepTokens)
	var r C.kiln_step_result
	r.struct_size = C.uint32_t(unsafe.Sizeof(r))
	if err := call(func() C.kiln_status { return C.kiln_cache_step(c.ptr, &params, &r) }); err != nil {
		return StepResult{}, err
	}
	return StepResult{int32(r.n_steps), int64(r.n_tokens), int32(r.n_active), float64(r.elapsed_ms)}, nil
}

// StartWorker starts kiln's worker thread, which steps the cache while requests are in flight.
func (c *Cache) StartWorker() error {
	return call(func() C.kiln_status { return C.kiln_cache_start_worker(c.ptr) })
}

// StopWorker stops the worker after its current step (requests in flight stay queued).
func (c *Cache) StopWorker() error {
	return call(func() C.kiln_status { return C.kiln_cache_stop_worker(c.ptr) })
}
