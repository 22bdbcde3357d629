//! Safe Rust binding of kiln's C API (`include/kiln/kiln.h`, ABI 1).
//!
//! - Handles free themselves (RAII) and keep what they depend on alive: a [`Session`] holds its
//!   [`Cache`], a cache its [`Model`], so the C rule "destroy sessions before their cache, caches
//!   before their model" always holds.
//! - Every fallible call returns [`Result`]; an [`Error`] carries the C [`Status`] and
//!   `kiln_last_error_message()`.
//! - Callbacks are closures. A panic inside one never unwinds into C: it is caught at the
//!   boundary, the C call is asked to stop, and the panic resumes on the caller's thread once
//!   the C call has returned (for a submitted request's callbacks: at the next [`Session::poll`]).
//! - `Send`/`Sync` follow kiln.h's thread rules: [`Model`], [`Cache`] and [`Sampler`] are `Send +
//!   Sync`; a [`Session`] is `Send` but not `Sync` (one thread at a time; `&mut self` for every
//!   call that changes it); a [`Canceller`] (`Send + Sync`) does what kiln.h allows from any
//!   thread: cancel and count tokens.
//!
//! ```no_run
//! use kiln::{Model, CacheOptions, TokenizeFlags};
//! let model = Model::load("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let cache = model.cache(&CacheOptions { n_ctx: 2048, ..Default::default() })?;
//! let mut session = cache.session()?;
//! session.append("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", TokenizeFlags::PARSE_SPECIAL)?;
//! for piece in session.stream(&kiln::RequestOptions { max_tokens: 32, ..Default::default() })? {
//!     print!("{}", piece?);
//! }
//! # Ok::<(), kiln::Error>(())
//! ```

use std::any::Any;
use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{BitOr, ControlFlow};
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;
use std::sync::{Arc, Mutex};

pub use kiln_sys as sys;

// ---------------------------------------------------------------- status and errors

/// A kiln_status other than KILN_OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    Io,
    Format,
    Unsupported,
    OutOfMemory,
    CacheFull,
    Cancelled,
    OutOfRange,
    BufferTooSmall,
    Busy,
    Internal,
    /// A status this binding does not know (a newer library).
    Other(i32),
}

impl Status {
    fn from_raw(code: sys::kiln_status) -> Status {
        match code {
            sys::KILN_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::KILN_ERR_IO => Status::Io,
            sys::KILN_ERR_FORMAT => Status::Format,
            sys::KILN_ERR_UNSUPPORTED => Status::Unsupported,
            sys::KILN_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::KILN_ERR_CACHE_FULL => Status::CacheFull,
            sys::KILN_ERR_CANCELLED => Status::Cancelled,
            sys::KILN_ERR_OUT_OF_RANGE => Status::OutOfRange,
            sys::KILN_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::KILN_ERR_BUSY => Status::Busy,
            sys::KILN_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        }
    }

    /// The C value (KILN_ERR_*).
    pub fn raw(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::KILN_ERR_INVALID_ARGUMENT,
            Status::Io => sys::KILN_ERR_IO,
            Status::Format => sys::KILN_ERR_FORMAT,
            Status::Unsupported => sys::KILN_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::KILN_ERR_OUT_OF_MEMORY,
            Status::CacheFull => sys::KILN_ERR_CACHE_FULL,
            Status::Cancelled => sys::KILN_ERR_CANCELLED,
            Status::OutOfRange => sys::KILN_ERR_OUT_OF_RANGE,
            Status::BufferTooSmall => sys::KILN_ERR_BUFFER_TOO_SMALL,
            Status::Busy => sys::KILN_ERR_BUSY,
            Status::Internal => sys::KILN_ERR_INTERNAL,
            Status::Other(code) => code,
        }
    }

    /// "KILN_ERR_FORMAT" (kiln_status_name).
    pub fn name(self) -> &'static str {
        // SAFETY: kiln_status_name returns static storage for any value.
        unsafe { CStr::from_ptr(sys::kiln_status_name(self.raw())) }.to_str().unwrap_or("KILN_ERR_?")
    }
}

/// A failed kiln call: its status and the library's message (what was wrong).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// The error of the last failed call on this thread.
    fn last(code: sys::kiln_status) -> Error {
        Error::new(Status::from_raw(code), last_error_message())
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.status.name())
        } else {
            write!(f, "{}: {}", self.status.name(), self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn last_error_message() -> String {
    // SAFETY: a per-thread NUL-terminated string, copied before any other kiln call.
    unsafe { CStr::from_ptr(sys::kiln_last_error_message()) }.to_string_lossy().into_owned()
}

fn check(code: sys::kiln_status) -> Result<()> {
    if code == sys::KILN_OK {
        Ok(())
    } else {
        Err(Error::last(code))
    }
}

fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::new(Status::InvalidArgument, format!("{what} contains a NUL byte")))
}

fn c_path(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| Error::new(Status::InvalidArgument, format!("path {} is not UTF-8", path.display())))?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| Error::new(Status::InvalidArgument, "the path contains a NUL byte"))
}

fn static_str(ptr: *const c_char) -> &'static str {
    // SAFETY: the callers pass kiln's static strings.
    unsafe { CStr::from_ptr(ptr) }.to_str().unwrap_or("")
}

/// Calls a `(buffer, capacity, *size)` function, growing the buffer to the size it reports.
fn sized_call<T: Copy + Default>(
    first: usize,
    mut call: impl FnMut(*mut T, usize, &mut usize) -> sys::kiln_status,
) -> Result<Vec<T>> {
    let mut capacity = first.max(1);
    loop {
        let mut buf = vec![T::default(); capacity];
        let mut n = 0usize;
        let code = call(buf.as_mut_ptr(), capacity, &mut n);
        if code == sys::KILN_ERR_BUFFER_TOO_SMALL && n > capacity {
            capacity = n;
            continue;
        }
        check(code)?;
        buf.truncate(n);
        return Ok(buf);
    }
}

/// Version of the libkiln loaded ("0.2.0").
pub fn version() -> &'static str {
    static_str(unsafe { sys::kiln_version() })
}

pub fn abi_version() -> i32 {
    unsafe { sys::kiln_abi_version() }
}

/// The CPU kernel level and features, e.g. "avx2 (avx2 fma f16c)".
pub fn cpu_info() -> &'static str {
    static_str(unsafe { sys::kiln_cpu_info() })
}

/// The compute backends this process can use, one per line.
pub fn backends() -> &'static str {
    static_str(unsafe { sys::kiln_backends() })
}

/// Text to bytes: whole UTF-8 characters out, a split character kept for the next piece, invalid
/// bytes as U+FFFD.
#[derive(Default)]
struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    fn push(&mut self, bytes: &[u8], last: bool) -> String {
        self.pending.extend_from_slice(bytes);
        let buf = std::mem::take(&mut self.pending);
        let mut out = String::new();
        let mut i = 0;
        while i < buf.len() {
            match std::str::from_utf8(&buf[i..]) {
                Ok(s) => {
                    out.push_str(s);
                    i = buf.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&buf[i..i + valid]).unwrap());
                    i += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            i += n;
                        }
                        None if last => {
                            out.push('\u{FFFD}');
                            i = buf.len();
                        }
                        None => break, // a character split across pieces
                    }
                }
            }
        }
        self.pending = buf[i..].to_vec();
        out
    }
}

type Panic = Box<dyn Any + Send + 'static>;

/// Runs a callback at the C boundary: a panic is stored (first one wins) and `on_panic` returned.
fn guarded<R>(slot: &mut Option<Panic>, on_panic: R, f: impl FnOnce() -> R) -> R {
    if slot.is_some() {
        return on_panic;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            *slot = Some(payload);
            on_panic
        }
    }
}

fn stop_code(flow: ControlFlow<()>) -> c_int {
    if flow.is_break() {
        1
    } else {
        0
    }
}

/// The `n` (key, value) metadata entries that `at` reads (kiln_model_meta_at, kiln_gguf_meta_at):
/// strings owned by the handle, copied here.
fn meta_entries(
    n: usize,
    at: impl Fn(usize, &mut *const c_char, &mut *const c_char) -> sys::kiln_status,
) -> Result<Vec<(String, String)>> {
    (0..n)
        .map(|i| {
            let (mut k, mut v) = (ptr::null(), ptr::null());
            check(at(i, &mut k, &mut v))?;
            let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            Ok((text(k), text(v)))
        })
        .collect()
}

// ---------------------------------------------------------------- inspecting a file

/// A GGUF file opened for inspection only: its metadata and what kiln lacks to run it. Works for
/// any valid GGUF, also one of an architecture kiln cannot load.
pub struct GgufFile {
    ptr: *mut sys::kiln_gguf,
}

// SAFETY: the handle is read-only after kiln_gguf_open; its getters only read it.
unsafe impl Send for GgufFile {}
unsafe impl Sync for GgufFile {}

impl GgufFile {
    /// Opens and validates `path`: `Status::Io` when it cannot be read, `Status::Format` when it
    /// is not a valid GGUF (the message names the field and byte offset).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_gguf_open(path.as_ptr(), &mut raw) })?;
        Ok(GgufFile { ptr: raw })
    }

    /// Every metadata entry as (key, value rendered as text).
    pub fn metadata(&self) -> Result<Vec<(String, String)>> {
        let n = unsafe { sys::kiln_gguf_meta_count(self.ptr) };
        meta_entries(n, |i, k, v| unsafe { sys::kiln_gguf_meta_at(self.ptr, i, k, v) })
    }

    /// What kiln lacks to run the file, one problem per entry; empty when it can run it.
    pub fn unsupported(&self) -> Vec<String> {
        // SAFETY: a NUL-terminated string owned by the handle.
        let text = unsafe { CStr::from_ptr(sys::kiln_gguf_unsupported(self.ptr)) };
        text.to_string_lossy().lines().map(str::to_owned).collect()
    }
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        unsafe { sys::kiln_gguf_destroy(self.ptr) }
    }
}

// ---------------------------------------------------------------- model

struct ModelRaw(*mut sys::kiln_model);

// SAFETY: kiln.h: "a kiln_model is immutable after load and may be used from any number of
// threads at once".
unsafe impl Send for ModelRaw {}
unsafe impl Sync for ModelRaw {}

impl Drop for ModelRaw {
    fn drop(&mut self) {
        // Every cache (and through it every session) holds an Arc of this: they are gone.
        unsafe { sys::kiln_model_destroy(self.0) }
    }
}

/// A loaded GGUF model. Cheap to clone (shared); usable from any thread.
#[derive(Clone)]
pub struct Model {
    raw: Arc<ModelRaw>,
}

/// kiln_model_info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub architecture: String,
    pub name: String,
    pub n_params: i64,
    pub size_bytes: i64,
    pub n_vocab: i32,
    pub n_ctx_train: i32,
    pub n_embd: i32,
    pub n_layer: i32,
    pub n_head: i32,
    pub n_head_kv: i32,
    pub head_dim: i32,
    pub n_ff: i32,
    pub token_bos: i32,
    pub token_eos: i32,
    pub token_eot: i32,
}

/// KILN_TOKENIZE_* flags; combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenizeFlags(u32);

impl TokenizeFlags {
    pub const NONE: TokenizeFlags = TokenizeFlags(0);
    /// Add BOS/EOS as the vocabulary asks.
    pub const ADD_SPECIAL: TokenizeFlags = TokenizeFlags(sys::KILN_TOKENIZE_ADD_SPECIAL);
    /// "<|im_start|>" in the text becomes the control token.
    pub const PARSE_SPECIAL: TokenizeFlags = TokenizeFlags(sys::KILN_TOKENIZE_PARSE_SPECIAL);
}

impl BitOr for TokenizeFlags {
    type Output = TokenizeFlags;
    fn bitor(self, rhs: TokenizeFlags) -> TokenizeFlags {
        TokenizeFlags(self.0 | rhs.0)
    }
}

/// One chat message for [`Model::apply_chat_template`].
#[derive(Debug, Clone, Copy)]
pub struct ChatMessage<'a> {
    pub role: &'a str,
    pub content: &'a str,
}

impl<'a> ChatMessage<'a> {
    pub fn system(content: &'a str) -> Self {
        ChatMessage { role: "system", content }
    }
    pub fn user(content: &'a str) -> Self {
        ChatMessage { role: "user", content }
    }
    pub fn assistant(content: &'a str) -> Self {
        ChatMessage { role: "assistant", content }
    }
}

/// Severity of a log line (kiln_log_level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// A load's log callback (see [`Model::load_with_log`]).
type LogCallback<'f> = &'f mut dyn FnMut(LogLevel, &str);

/// The callbacks of one load, shared by the progress and log trampolines (both run on the
/// loading thread, inside kiln_model_load).
struct LoadState<'f> {
    progress: &'f mut dyn FnMut(f32) -> ControlFlow<()>,
    log: Option<LogCallback<'f>>,
    panic: Option<Panic>,
}

unsafe extern "C" fn progress_trampoline(progress: f32, user_data: *mut c_void) -> c_int {
    let state = &mut *(user_data as *mut LoadState<'_>);
    let callback = &mut state.progress;
    guarded(&mut state.panic, 1, || stop_code(callback(progress)))
}

unsafe extern "C" fn log_trampoline(
    level: sys::kiln_log_level,
    message: *const c_char,
    user_data: *mut c_void,
) {
    let state = &mut *(user_data as *mut LoadState<'_>);
    let log = match state.log.as_mut() {
        Some(log) => log,
        None => return,
    };
    let level = match level {
        sys::KILN_LOG_DEBUG => LogLevel::Debug,
        sys::KILN_LOG_INFO => LogLevel::Info,
        sys::KILN_LOG_WARN => LogLevel::Warn,
        _ => LogLevel::Error,
    };
    // SAFETY: a NUL-terminated line, valid during the call.
    let line = CStr::from_ptr(message).to_string_lossy();
    guarded(&mut state.panic, (), || log(level, &line))
}

impl Model {
    /// Loads a GGUF file (memory-mapped).
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(path, true, |_| ControlFlow::Continue(()))
    }

    /// Loads a GGUF file, calling `progress(fraction)` as it goes; `ControlFlow::Break` cancels
    /// the load (an error with [`Status::Cancelled`]). `use_mmap` false reads the file into memory.
    pub fn load_with(
        path: impl AsRef<Path>,
        use_mmap: bool,
        mut progress: impl FnMut(f32) -> ControlFlow<()>,
    ) -> Result<Model> {
        Model::load_impl(path.as_ref(), use_mmap, &mut progress, None)
    }

    /// As [`Model::load_with`], also passing the load's log lines to `log` (on this thread; a
    /// failed load logs its error message at [`LogLevel::Error`]).
    pub fn load_with_log(
        path: impl AsRef<Path>,
        use_mmap: bool,
        mut progress: impl FnMut(f32) -> ControlFlow<()>,
        mut log: impl FnMut(LogLevel, &str),
    ) -> Result<Model> {
        Model::load_impl(path.as_ref(), use_mmap, &mut progress, Some(&mut log))
    }

    fn load_impl<'f>(
        path: &Path,
        use_mmap: bool,
        progress: &'f mut dyn FnMut(f32) -> ControlFlow<()>,
        log: Option<LogCallback<'f>>,
    ) -> Result<Model> {
        let path = c_path(path)?;
        let mut params = std::mem::MaybeUninit::<sys::kiln_model_params>::zeroed();
        check(unsafe {
            sys::kiln_model_params_init(params.as_mut_ptr(), std::mem::size_of::<sys::kiln_model_params>())
        })?;
        let mut params = unsafe { params.assume_init() };
        let has_log = log.is_some();
        let mut state = LoadState { progress, log, panic: None };
        let user_data = &mut state as *mut LoadState<'_> as *mut c_void;
        params.path = path.as_ptr();
        params.use_mmap = use_mmap as c_int;
        params.progress = Some(progress_trampoline);
        params.progress_user_data = user_data;
        if has_log {
            params.log = Some(log_trampoline);
            params.log_user_data = user_data;
        }
        let mut raw = ptr::null_mut();
        let code = unsafe { sys::kiln_model_load(&params, &mut raw) };
        if let Some(panic) = state.panic.take() {
            unsafe { sys::kiln_model_destroy(raw) }; // NULL unless the load succeeded anyway
            resume_unwind(panic);
        }
        check(code)?;
        Ok(Model { raw: Arc::new(ModelRaw(raw)) })
    }

    fn ptr(&self) -> *mut sys::kiln_model {
        self.raw.0
    }

    pub fn info(&self) -> Result<ModelInfo> {
        let mut i: sys::kiln_model_info = unsafe { std::mem::zeroed() };
        i.struct_size = std::mem::size_of::<sys::kiln_model_info>() as u32;
        check(unsafe { sys::kiln_model_get_info(self.ptr(), &mut i) })?;
        let text = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        Ok(ModelInfo {
            architecture: text(i.architecture),
            name: text(i.name),
            n_params: i.n_params,
            size_bytes: i.size_bytes,
            n_vocab: i.n_vocab,
            n_ctx_train: i.n_ctx_train,
            n_embd: i.n_embd,
            n_layer: i.n_layer,
            n_head: i.n_head,
            n_head_kv: i.n_head_kv,
            head_dim: i.head_dim,
            n_ff: i.n_ff,
            token_bos: i.token_bos,
            token_eos: i.token_eos,
            token_eot: i.token_eot,
        })
    }

    /// Every GGUF metadata entry as (key, value rendered as text).
    pub fn metadata(&self) -> Result<Vec<(String, String)>> {
        let n = unsafe { sys::kiln_model_meta_count(self.ptr()) };
        meta_entries(n, |i, k, v| unsafe { sys::kiln_model_meta_at(self.ptr(), i, k, v) })
    }

    /// Metadata `key` rendered as text; None when the file has no such key.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        let key = c_string(key, "the key")?;
        let mut v = ptr::null();
        match unsafe { sys::kiln_model_meta_get(self.ptr(), key.as_ptr(), &mut v) } {
            sys::KILN_ERR_OUT_OF_RANGE => Ok(None),
            code => {
                check(code)?;
                Ok(Some(unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned()))
            }
        }
    }

    /// True when `token` ends generation.
    pub fn is_eog(&self, token: i32) -> bool {
        unsafe { sys::kiln_model_token_is_eog(self.ptr(), token) != 0 }
    }

    pub fn tokenize(&self, text: &str, flags: TokenizeFlags) -> Result<Vec<i32>> {
        sized_call(text.len() + 2, |buf, cap, n| unsafe {
            sys::kiln_tokenize(self.ptr(), text.as_ptr().cast(), text.len(), flags.0, buf, cap, n)
        })
    }

    /// The bytes of `tokens` (may end inside a UTF-8 character).
    pub fn detokenize_bytes(&self, tokens: &[i32], render_special: bool) -> Result<Vec<u8>> {
        let flags = if render_special { sys::KILN_DETOKENIZE_RENDER_SPECIAL } else { 0 };
        sized_call(tokens.len() * 16 + 16, |buf: *mut u8, cap, n| unsafe {
            sys::kiln_detokenize(self.ptr(), tokens.as_ptr(), tokens.len(), flags, buf.cast(), cap, n)
        })
    }

    /// The text of `tokens` (invalid UTF-8 becomes U+FFFD).
    pub fn detokenize(&self, tokens: &[i32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.detokenize_bytes(tokens, false)?).into_owned())
    }

    /// Renders a conversation. `template` None: the model's own; else a Jinja source or a family
    /// name ("chatml", "llama3", ...).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage<'_>],
        template: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let owned: Vec<(CString, CString)> = messages
            .iter()
            .map(|m| Ok((c_string(m.role, "a role")?, c_string(m.content, "a message")?)))
            .collect::<Result<_>>()?;
        let raw: Vec<sys::kiln_chat_message> = owned
            .iter()
            .map(|(r, c)| sys::kiln_chat_message { role: r.as_ptr(), content: c.as_ptr() })
            .collect();
        let tmpl = template.map(|t| c_string(t, "the template")).transpose()?;
        let tmpl_ptr = tmpl.as_ref().map_or(ptr::null(), |t| t.as_ptr());
        let guess = messages.iter().map(|m| m.content.len() + 32).sum::<usize>() + 256;
        let bytes = sized_call(guess, |buf: *mut u8, cap, n| unsafe {
            sys::kiln_chat_apply_template(
                self.ptr(),
                tmpl_ptr,
                raw.as_ptr(),
                raw.len(),
                add_generation_prompt as c_int,
                buf.cast(),
                cap,
                n,
            )
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A KV cache for this model.
    pub fn cache(&self, options: &CacheOptions) -> Result<Cache> {
        Cache::new(self, options)
    }
}

// ---------------------------------------------------------------- cache

/// Element type of the stored K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    F32,
    Bf16,
    /// ggml's q8_0 blocks; the model's head size must be a multiple of 32.
    Q8_0,
}

/// The compute backend a cache asks for (kiln_backend_kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Cpu,
    Cuda,
    /// CUDA when it can run the model, else the CPU.
    Auto,
}

/// How MLA models (deepseek2) compute prompt chunks (kiln_mla_prefill); other models ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MlaPrefill {
    /// As decode steps: every bitwise guarantee holds.
    #[default]
    Absorbed,
    /// Long chunks decompressed where a measured cost rule says it is faster; equal to float
    /// rounding, so a token's last logit bits can depend on how its prompt was chunked.
    Measured,
}

/// kiln_cache_params; `Default` is kiln's defaults.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// KV pool bytes; 0: one full context.
    pub pool_bytes: usize,
    pub block_size: i32,
    pub kv_type: KvType,
    pub prefix_caching: bool,
    /// Most tokens one session may hold; 0: the training context.
    pub n_ctx: i32,
    /// Compute threads; 0: physical cores.
    pub n_threads: i32,
    pub llama_cpp_order: bool,
    /// Most tokens in one step's forward pass, >= 1 (default 512).
    pub step_tokens: i32,
    /// Cuda or Auto: the CUDA device `cuda_device` when it can run the model, else the CPU (the
    /// cache is created either way; [`Cache::backend`] says which and why).
    pub backend: Backend,
    pub cuda_device: i32,
    pub mla_prefill: MlaPrefill,
    /// Models with sliding-window and global layers (gemma3), CPU backend: false (default)
    /// releases the sliding layers' K/V once every window has left it, back to the pool; true
    /// keeps every layer's K/V (llama.cpp's --swa-full).
    pub swa_full: bool,
    /// CPU backend: each worker thread on a core of its own (for hosts that step the cache in
    /// short bursts, such as a game loop; `kiln_cache_params.pin_threads`).
    pub pin_threads: bool,
}

impl Default for CacheOptions {
    fn default() -> Self {
        let p = init_params::<sys::kiln_cache_params>(sys::kiln_cache_params_init);
        CacheOptions {
            pool_bytes: p.pool_bytes,
            block_size: p.block_size,
            kv_type: KvType::F16,
            prefix_caching: p.prefix_caching != 0,
            n_ctx: p.n_ctx,
            n_threads: p.n_threads,
            llama_cpp_order: p.llama_cpp_order != 0,
            step_tokens: p.step_tokens,
            backend: Backend::Cpu,
            cuda_device: p.cuda_device,
            mla_prefill: MlaPrefill::Absorbed,
            swa_full: p.swa_full != 0,
            pin_threads: p.pin_threads != 0,
        }
    }
}

/// A params struct with its defaults, through its init function (which sets struct_size).
fn init_params<T>(init: unsafe extern "C" fn(*mut T, usize) -> sys::kiln_status) -> T {
    let mut p = std::mem::MaybeUninit::<T>::zeroed();
    let code = unsafe { init(p.as_mut_ptr(), std::mem::size_of::<T>()) };
    assert_eq!(code, sys::KILN_OK, "a kiln *_params_init refused its own struct size");
    // SAFETY: zeroed, then filled by the init function; every field is a plain value or pointer.
    unsafe { p.assume_init() }
}

/// An output struct with struct_size set, the rest zero.
fn output<T>() -> T {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: every output struct starts with `uint32_t struct_size` and is plain data.
    unsafe {
        *(v.as_mut_ptr() as *mut u32) = std::mem::size_of::<T>() as u32;
        v.assume_init()
    }
}

struct CacheRaw {
    ptr: *mut sys::kiln_cache,
    _model: Arc<ModelRaw>, // dropped after the cache
}

// SAFETY: kiln.h: "A cache is thread-safe: any thread may create sessions on it or read its stats
// at any time"; kiln_cache_step, _start_worker and _stop_worker are marked thread-safe.
unsafe impl Send for CacheRaw {}
unsafe impl Sync for CacheRaw {}

impl Drop for CacheRaw {
    fn drop(&mut self) {
        unsafe { sys::kiln_cache_destroy(self.ptr) }
    }
}

/// A paged KV cache and the engine that computes into it. Cheap to clone (shared); usable from
/// any thread. Sessions live in it.
#[derive(Clone)]
pub struct Cache {
    raw: Arc<CacheRaw>,
    model: Model,
}

/// kiln_cache_stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub n_ctx: i32,
    pub block_size: i32,
    pub blocks_total: i32,
    pub blocks_free: i32,
    pub blocks_used: i32,
    pub blocks_cached: i32,
    pub n_sequences: i32,
    pub prefix_lookups: i64,
    pub prefix_query_tokens: i64,
    pub prefix_hit_tokens: i64,
    pub evictions: i64,
    pub bytes_per_token: usize,
    pub block_bytes: usize,
    /// K/V bytes held by sessions now.
    pub kv_bytes_in_use: usize,
    /// The sliding-window layers' blocks ([`CacheOptions::swa_full`] false; zero otherwise): 0 (they
    /// share the pool), those held (part of blocks_used), those released so far because every
    /// window had left them, and block_bytes.
    pub sliding_blocks_total: i32,
    pub sliding_blocks_used: i32,
    pub sliding_blocks_released: i64,
    pub sliding_block_bytes: usize,
}

/// What one [`Cache::step`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepResult {
    pub n_steps: i32,
    pub n_tokens: i64,
    /// Requests still in flight on the cache.
    pub n_active: i32,
    pub elapsed_ms: f64,
}

impl Cache {
    pub fn new(model: &Model, options: &CacheOptions) -> Result<Cache> {
        let mut p = init_params::<sys::kiln_cache_params>(sys::kiln_cache_params_init);
        p.pool_bytes = options.pool_bytes;
        p.block_size = options.block_size;
        p.kv_type = match options.kv_type {
            KvType::F16 => sys::KILN_KV_F16,
            KvType::F32 => sys::KILN_KV_F32,
            KvType::Bf16 => sys::KILN_KV_BF16,
            KvType::Q8_0 => sys::KILN_KV_Q8_0,
        };
        p.prefix_caching = options.prefix_caching as c_int;
        p.n_ctx = options.n_ctx;
        p.n_threads = options.n_threads;
        p.llama_cpp_order = options.llama_cpp_order as c_int;
        p.step_tokens = options.step_tokens;
        p.backend = match options.backend {
            Backend::Cpu => sys::KILN_BACKEND_CPU,
            Backend::Cuda => sys::KILN_BACKEND_CUDA,
            Backend::Auto => sys::KILN_BACKEND_AUTO,
        };
        p.cuda_device = options.cuda_device;
        p.mla_prefill = match options.mla_prefill {
            MlaPrefill::Absorbed => sys::KILN_MLA_PREFILL_ABSORBED,
            MlaPrefill::Measured => sys::KILN_MLA_PREFILL_MEASURED,
        };
        p.swa_full = options.swa_full as c_int;
        p.pin_threads = options.pin_threads as c_int;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_cache_create(model.ptr(), &p, &mut raw) })?;
        Ok(Cache { raw: Arc::new(CacheRaw { ptr: raw, _model: model.raw.clone() }), model: model.clone() })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The backend the cache runs on ("cpu (avx2, 4 threads)"), followed by "; cuda requested,
    /// running on the CPU: <reason>" when a CUDA request fell back.
    pub fn backend(&self) -> String {
        // SAFETY: a NUL-terminated string owned by the cache, copied at once.
        unsafe { CStr::from_ptr(sys::kiln_cache_backend(self.raw.ptr)) }.to_string_lossy().into_owned()
    }

    pub fn stats(&self) -> Result<CacheStats> {
        let mut s: sys::kiln_cache_stats = output();
        check(unsafe { sys::kiln_cache_get_stats(self.raw.ptr, &mut s) })?;
        Ok(CacheStats {
            n_ctx: s.n_ctx,
            block_size: s.block_size,
            blocks_total: s.blocks_total,
            blocks_free: s.blocks_free,
            blocks_used: s.blocks_used,
            blocks_cached: s.blocks_cached,
            n_sequences: s.n_sequences,
            prefix_lookups: s.prefix_lookups,
            prefix_query_tokens: s.prefix_query_tokens,
            prefix_hit_tokens: s.prefix_hit_tokens,
            evictions: s.evictions,
            bytes_per_token: s.bytes_per_token,
            block_bytes: s.block_bytes,
            kv_bytes_in_use: s.kv_bytes_in_use,
            sliding_blocks_total: s.sliding_blocks_total,
            sliding_blocks_used: s.sliding_blocks_used,
            sliding_blocks_released: s.sliding_blocks_released,
            sliding_block_bytes: s.sliding_block_bytes,
        })
    }

    /// A new empty session that decodes greedily.
    pub fn session(&self) -> Result<Session> {
        Session::create(self, None)
    }

    /// A new empty session sampling with `sampler` (which it copies).
    pub fn session_with(&self, sampler: &Sampler) -> Result<Session> {
        Session::create(self, Some(sampler))
    }

    /// Runs steps on this thread: one (`time_budget_ms` 0), or while the next one is expected to
    /// end within the budget. Returns at once when nothing is in flight.
    pub fn step(&self, time_budget_ms: f64) -> Result<StepResult> {
        self.step_with(time_budget_ms, 0)
    }

    /// As [`Cache::step`], with at most `step_tokens` tokens per forward pass (0: the cache's own).
    pub fn step_with(&self, time_budget_ms: f64, step_tokens: i32) -> Result<StepResult> {
        let mut p = init_params::<sys::kiln_step_params>(sys::kiln_step_params_init);
        p.time_budget_ms = time_budget_ms;
        p.step_tokens = step_tokens;
        let mut r: sys::kiln_step_result = output();
        check(unsafe { sys::kiln_cache_step(self.raw.ptr, &p, &mut r) })?;
        Ok(StepResult {
            n_steps: r.n_steps,
            n_tokens: r.n_tokens,
            n_active: r.n_active,
            elapsed_ms: r.elapsed_ms,
        })
    }

    /// Starts the library's worker thread, which steps the cache while requests are in flight.
    pub fn start_worker(&self) -> Result<()> {
        check(unsafe { sys::kiln_cache_start_worker(self.raw.ptr) })
    }

    /// Stops the worker after its current step (requests in flight stay queued).
    pub fn stop_worker(&self) -> Result<()> {
        check(unsafe { sys::kiln_cache_stop_worker(self.raw.ptr) })
    }
}

// ---------------------------------------------------------------- sampler

/// kiln_sampler_params; `Default` is kiln's (llama.cpp's) defaults. `temperature <= 0` is greedy.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub typical_p: f32,
    pub repeat_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub penalty_last_n: i32,
    pub seed: u64,
    /// Top log-probabilities kept per sampled token ([`Session::logprobs`]).
    pub n_logprobs: i32,
    /// (token, bias) pairs; `f32::NEG_INFINITY` bans a token.
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        let p = init_params::<sys::kiln_sampler_params>(sys::kiln_sampler_params_init);
        SamplerOptions {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            typical_p: p.typical_p,
            repeat_penalty: p.repeat_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            penalty_last_n: p.penalty_last_n,
            seed: p.seed,
            n_logprobs: p.n_logprobs,
            logit_bias: Vec::new(),
        }
    }
}

/// An immutable set of sampling parameters; sessions copy it when they are created.
pub struct Sampler {
    ptr: *mut sys::kiln_sampler,
}

// SAFETY: kiln.h: "A kiln_sampler is an immutable set of sampling parameters ... one sampler may
// serve many sessions"; it is only read after creation.
unsafe impl Send for Sampler {}
unsafe impl Sync for Sampler {}

impl Sampler {
    pub fn new(options: &SamplerOptions) -> Result<Sampler> {
        let mut p = init_params::<sys::kiln_sampler_params>(sys::kiln_sampler_params_init);
        p.temperature = options.temperature;
        p.top_k = options.top_k;
        p.top_p = options.top_p;
        p.min_p = options.min_p;
        p.typical_p = options.typical_p;
        p.repeat_penalty = options.repeat_penalty;
        p.frequency_penalty = options.frequency_penalty;
        p.presence_penalty = options.presence_penalty;
        p.penalty_last_n = options.penalty_last_n;
        p.seed = options.seed;
        p.n_logprobs = options.n_logprobs;
        let bias: Vec<sys::kiln_logit_bias> =
            options.logit_bias.iter().map(|&(token, bias)| sys::kiln_logit_bias { token, bias }).collect();
        p.logit_bias = if bias.is_empty() { ptr::null() } else { bias.as_ptr() };
        p.n_logit_bias = bias.len();
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_sampler_create(&p, &mut raw) })?;
        Ok(Sampler { ptr: raw })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        unsafe { sys::kiln_sampler_destroy(self.ptr) }
    }
}

// ---------------------------------------------------------------- strategies

/// kiln_ngram_params; `Default` is kiln's defaults.
#[derive(Debug, Clone)]
pub struct NgramOptions {
    pub max_ngram: i32,
    pub min_ngram: i32,
    pub max_draft: i32,
    pub start_draft: i32,
    pub max_skip: i32,
    pub adaptive: bool,
    /// >= 0: a fixed pass cost model; < 0: measured.
    pub fixed_pass_cost_beta: f64,
}

impl Default for NgramOptions {
    fn default() -> Self {
        let p = init_params::<sys::kiln_ngram_params>(sys::kiln_ngram_params_init);
        NgramOptions {
            max_ngram: p.max_ngram,
            min_ngram: p.min_ngram,
            max_draft: p.max_draft,
            start_draft: p.start_draft,
            max_skip: p.max_skip,
            adaptive: p.adaptive != 0,
            fixed_pass_cost_beta: p.fixed_pass_cost_beta,
        }
    }
}

/// kiln_draft_params; `Default` is kiln's defaults.
#[derive(Debug, Clone)]
pub struct DraftOptions {
    pub max_draft: i32,
    pub adaptive: bool,
    pub n_threads: i32,
    pub n_ctx: i32,
    pub fixed_pass_cost_beta: f64,
}

impl Default for DraftOptions {
    fn default() -> Self {
        let p = init_params::<sys::kiln_draft_params>(sys::kiln_draft_params_init);
        DraftOptions {
            max_draft: p.max_draft,
            adaptive: p.adaptive != 0,
            n_threads: p.n_threads,
            n_ctx: p.n_ctx,
            fixed_pass_cost_beta: p.fixed_pass_cost_beta,
        }
    }
}

/// kiln_medusa_params; `Default` is kiln's defaults.
#[derive(Debug, Clone)]
pub struct MedusaOptions {
    /// Most tree nodes verified per step (the head file's tree, cut); 0: the whole tree.
    pub max_draft: i32,
    /// Threads of the heads' LM-head matmul; <= 0: physical cores.
    pub n_threads: i32,
    /// The n-gram prompt-lookup continuation of the context merged into every tree, on top of
    /// the head file's tree (the default): text that copies its context gets long accepted runs.
    pub merge_ngram: bool,
}

impl Default for MedusaOptions {
    fn default() -> Self {
        let p = init_params::<sys::kiln_medusa_params>(sys::kiln_medusa_params_init);
        MedusaOptions { max_draft: p.max_draft, n_threads: p.n_threads, merge_ngram: p.merge_ngram != 0 }
    }
}

/// kiln_eagle_params; `Default` is kiln's defaults.
#[derive(Debug, Clone)]
pub struct EagleOptions {
    /// Children per expanded node and nodes expanded per depth, 1..=64; 0 (the default): chosen
    /// each step from the measured pass costs.
    pub top_k: i32,
    /// Deepest draft node, 1..=16; 0 (the default): deeper while a draft step pays for itself.
    pub max_depth: i32,
    /// Nodes verified per step; 0: chosen each step from the drafts' probabilities and the
    /// measured pass cost.
    pub tree_tokens: i32,
    /// Threads of the head's matmuls; <= 0: physical cores.
    pub n_threads: i32,
    /// The n-gram prompt-lookup continuation of the context merged into every tree, on top of
    /// `tree_tokens` (the default): text that copies its context gets long accepted runs.
    pub merge_ngram: bool,
}

impl Default for EagleOptions {
    fn default() -> Self {
        let p = init_params::<sys::kiln_eagle_params>(sys::kiln_eagle_params_init);
        EagleOptions {
            top_k: p.top_k,
            max_depth: p.max_depth,
            tree_tokens: p.tree_tokens,
            n_threads: p.n_threads,
            merge_ngram: p.merge_ngram != 0,
        }
    }
}

/// A speculative-decoding strategy. It serves one session at a time: [`Session::set_strategy`]
/// moves it into the session, which gives it back when replaced.
pub struct Strategy {
    ptr: *mut sys::kiln_strategy,
    _target: Option<Model>,
}

// SAFETY: a strategy is used only through the one session it is attached to (kiln.h: "A strategy
// serves one session at a time"), so it may move between threads; it is not Sync.
unsafe impl Send for Strategy {}

impl Strategy {
    /// N-gram prompt lookup (no model).
    pub fn ngram(options: &NgramOptions) -> Result<Strategy> {
        let mut p = init_params::<sys::kiln_ngram_params>(sys::kiln_ngram_params_init);
        p.max_ngram = options.max_ngram;
        p.min_ngram = options.min_ngram;
        p.max_draft = options.max_draft;
        p.start_draft = options.start_draft;
        p.max_skip = options.max_skip;
        p.adaptive = options.adaptive as i32;
        p.fixed_pass_cost_beta = options.fixed_pass_cost_beta;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_strategy_create_ngram(&p, &mut raw) })?;
        Ok(Strategy { ptr: raw, _target: None })
    }

    /// A draft model from `draft_path` (same vocabulary size as `target`).
    pub fn draft(target: &Model, draft_path: impl AsRef<Path>, options: &DraftOptions) -> Result<Strategy> {
        let path = c_path(draft_path.as_ref())?;
        let mut p = init_params::<sys::kiln_draft_params>(sys::kiln_draft_params_init);
        p.max_draft = options.max_draft;
        p.adaptive = options.adaptive as i32;
        p.n_threads = options.n_threads;
        p.n_ctx = options.n_ctx;
        p.fixed_pass_cost_beta = options.fixed_pass_cost_beta;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_strategy_create_draft(target.ptr(), path.as_ptr(), &p, &mut raw) })?;
        Ok(Strategy { ptr: raw, _target: Some(target.clone()) })
    }

    /// Trained Medusa heads for `target` from the head file `head_path` (tools/train/ makes them;
    /// the repository's models/ holds one for the default model). A head trained for another
    /// model, or a file that is not a head, fails with `Status::InvalidArgument` saying what
    /// differs; a missing file with `Status::Io`.
    pub fn medusa(target: &Model, head_path: impl AsRef<Path>, options: &MedusaOptions) -> Result<Strategy> {
        let path = c_path(head_path.as_ref())?;
        let mut p = init_params::<sys::kiln_medusa_params>(sys::kiln_medusa_params_init);
        p.max_draft = options.max_draft;
        p.n_threads = options.n_threads;
        p.merge_ngram = options.merge_ngram as i32;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_strategy_create_medusa(target.ptr(), path.as_ptr(), &p, &mut raw) })?;
        // The heads share the target's output matrix: the strategy keeps the model alive.
        Ok(Strategy { ptr: raw, _target: Some(target.clone()) })
    }

    /// An EAGLE head for `target` from the head file `head_path` (architecture "eagle";
    /// kiln-mkeagle writes untrained ones). A head for another model or a file that is not an
    /// eagle head fails with `Status::InvalidArgument`, a malformed one with `Status::Format`.
    pub fn eagle(target: &Model, head_path: impl AsRef<Path>, options: &EagleOptions) -> Result<Strategy> {
        let path = c_path(head_path.as_ref())?;
        let mut p = init_params::<sys::kiln_eagle_params>(sys::kiln_eagle_params_init);
        p.top_k = options.top_k;
        p.max_depth = options.max_depth;
        p.tree_tokens = options.tree_tokens;
        p.n_threads = options.n_threads;
        p.merge_ngram = options.merge_ngram as i32;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_strategy_create_eagle(target.ptr(), path.as_ptr(), &p, &mut raw) })?;
        // The head reads the target's features and shares its vocabulary matrices.
        Ok(Strategy { ptr: raw, _target: Some(target.clone()) })
    }
}

impl Drop for Strategy {
    fn drop(&mut self) {
        // Never attached to a live session here: a session owns its strategy and drops it after
        // kiln_session_destroy, or hands it back only after detaching it.
        unsafe { sys::kiln_strategy_destroy(self.ptr) }
    }
}

/// kiln_spec_metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecMetrics {
    pub steps: i64,
    pub drafted: i64,
    pub accepted: i64,
    pub generated: i64,
    pub mean_accepted_per_step: f64,
    pub target_passes_per_token: f64,
}

// ---------------------------------------------------------------- session

/// Why a generate or request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// An end-of-generation token (kept in the session, not emitted).
    Eog,
    MaxTokens,
    /// A stop string appeared (it is not emitted).
    StopString,
    /// The callback returned `ControlFlow::Break`.
    Callback,
    Cancelled,
    ContextFull,
    Other(i32),
}

impl StopReason {
    fn from_raw(code: sys::kiln_stop_reason) -> StopReason {
        match code {
            sys::KILN_STOP_EOG => StopReason::Eog,
            sys::KILN_STOP_MAX_TOKENS => StopReason::MaxTokens,
            sys::KILN_STOP_STRING => StopReason::StopString,
            sys::KILN_STOP_CALLBACK => StopReason::Callback,
            sys::KILN_STOP_CANCELLED => StopReason::Cancelled,
            sys::KILN_STOP_CONTEXT_FULL => StopReason::ContextFull,
            other => StopReason::Other(other),
        }
    }
}

/// What [`Session::generate`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub text: String,
    /// The emitted token ids (an end-of-generation token is kept in the session but not here).
    pub tokens: Vec<i32>,
    /// Tokens generated and kept in the session.
    pub n_tokens: i32,
    pub stop_reason: StopReason,
}

/// kiln_token_logprob.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    pub token: i32,
    pub logprob: f32,
}

/// A prompt and limits for [`Session::submit`] and [`Session::stream`]; also the generate limits
/// for [`Session::generate`] (which ignores `text` and `tokens`).
#[derive(Debug, Clone)]
pub struct RequestOptions<'a> {
    /// Prompt appended first.
    pub text: Option<&'a str>,
    pub text_flags: TokenizeFlags,
    /// Token ids appended after `text`.
    pub tokens: &'a [i32],
    /// Tokens to generate after the prompt; 0: only compute the prompt.
    pub max_tokens: i32,
    pub stop: &'a [&'a str],
}

impl Default for RequestOptions<'_> {
    fn default() -> Self {
        RequestOptions {
            text: None,
            text_flags: TokenizeFlags::NONE,
            tokens: &[],
            max_tokens: 128,
            stop: &[],
        }
    }
}

type OnToken = Box<dyn FnMut(i32, &str) -> ControlFlow<()> + Send>;
type OnDone = Box<dyn FnOnce(Result<(StopReason, i32)>) + Send>;

/// Callbacks of a submitted request. They run on whatever thread steps the cache (the
/// [`Cache::step`] caller, the worker, a blocking call on another session), so they are `Send`.
#[derive(Default)]
pub struct RequestCallbacks {
    on_token: Option<OnToken>,
    on_done: Option<OnDone>,
}

impl RequestCallbacks {
    pub fn new() -> Self {
        Self::default()
    }
    /// Each token and the text it completed (token -1: held-back text at the end);
    /// `ControlFlow::Break` ends the request. With it set, [`Session::poll`] returns no text.
    pub fn on_token(mut self, f: impl FnMut(i32, &str) -> ControlFlow<()> + Send + 'static) -> Self {
        self.on_token = Some(Box::new(f));
        self
    }
    /// Called once when the request ends: the stop reason and generated token count, or the error.
    pub fn on_done(mut self, f: impl FnOnce(Result<(StopReason, i32)>) + Send + 'static) -> Self {
        self.on_done = Some(Box::new(f));
        self
    }
}

/// Everything a submitted request's C side may point at, until the request has ended.
struct RequestState {
    _text: Vec<u8>,
    _tokens: Vec<i32>,
    _stop: Vec<CString>,
    _stop_ptrs: Vec<*const c_char>,
    on_token: Option<OnToken>,
    on_done: Option<OnDone>,
    decoder: Utf8Decoder,
    /// Shared with the session, which resumes a caught panic at its next poll.
    panic: Arc<Mutex<Option<Panic>>>,
}

// SAFETY: the raw pointers point into the Vecs beside them; the callbacks are Send.
unsafe impl Send for RequestState {}

unsafe extern "C" fn request_token_trampoline(
    token: i32,
    piece: *const c_char,
    len: usize,
    user_data: *mut c_void,
) -> c_int {
    // Field by field through the raw pointer: the callbacks of one cache never run concurrently,
    // and the session touches the state only to free it once the request has ended.
    let state = user_data as *mut RequestState;
    let bytes = if len == 0 { &[][..] } else { std::slice::from_raw_parts(piece.cast::<u8>(), len) };
    let text = (*state).decoder.push(bytes, token < 0);
    let callback = match (*state).on_token.as_mut() {
        Some(callback) => callback,
        None => return 0,
    };
    let mut slot = (*state).panic.lock().unwrap_or_else(|e| e.into_inner());
    guarded(&mut slot, 1, || stop_code(callback(token, &text)))
}

unsafe extern "C" fn request_done_trampoline(
    _session: *mut sys::kiln_session,
    status: sys::kiln_status,
    reason: sys::kiln_stop_reason,
    n_tokens: i32,
    user_data: *mut c_void,
) {
    let state = user_data as *mut RequestState;
    let outcome = if status == sys::KILN_OK {
        Ok((StopReason::from_raw(reason), n_tokens))
    } else {
        Err(Error::last(status))
    };
    if let Some(callback) = (*state).on_done.take() {
        let mut slot = (*state).panic.lock().unwrap_or_else(|e| e.into_inner());
        guarded(&mut slot, (), || callback(outcome));
    }
}

/// The C session and what must outlive it: destroyed first (which ends a request in flight),
/// then the request's state and the strategy, then the cache reference.
struct SessionRaw {
    ptr: *mut sys::kiln_session,
    /// The last submitted request's state (Box::into_raw; null before the first submit): a raw
    /// pointer, since the stepping thread reads it through the copy kiln holds.
    request: Mutex<*mut RequestState>,
    /// Where that request's callbacks leave a caught panic.
    request_panic: Arc<Mutex<Option<Panic>>>,
    strategy: Mutex<Option<Strategy>>,
    _cache: Arc<CacheRaw>,
}

impl SessionRaw {
    /// Frees a request state made by Box::into_raw, once its request has ended.
    unsafe fn free_request(state: *mut RequestState) {
        if !state.is_null() {
            drop(Box::from_raw(state));
        }
    }
}

// SAFETY: shared only between a Session (which makes every call but cancel/n_tokens/poll through
// &mut self) and its Cancellers, which call kiln_session_cancel and kiln_session_n_tokens:
// kiln.h allows both "from any thread at any time (but not concurrently with
// kiln_session_destroy)", and the Arc guarantees destroy comes after the last of them. The request
// pointer is replaced only after kiln accepted a new submit (so the old request has ended) and
// freed only after destroy.
unsafe impl Send for SessionRaw {}
unsafe impl Sync for SessionRaw {}

impl Drop for SessionRaw {
    fn drop(&mut self) {
        // Destroying the session ends a request in flight; then nothing points at its state.
        unsafe { sys::kiln_session_destroy(self.ptr) };
        let request = *self.request.get_mut().unwrap_or_else(|e| e.into_inner());
        unsafe { SessionRaw::free_request(request) };
    }
}

/// One conversation in a cache: tokens, sampler copy and random state.
///
/// `Send`, not `Sync`: kiln.h lets one thread at a time use a session. To cancel from another
/// thread, hand it a [`Canceller`].
pub struct Session {
    raw: Arc<SessionRaw>,
    cache: Cache,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

/// Cancels or counts the tokens of a session from any thread (`Send + Sync`, cheap to clone). It
/// keeps the C session alive, so it is never used after the session is destroyed.
#[derive(Clone)]
pub struct Canceller {
    raw: Arc<SessionRaw>,
}

impl Canceller {
    /// Stops the call or request in flight on the session (see kiln_session_cancel).
    pub fn cancel(&self) {
        // Only fails for NULL.
        unsafe { sys::kiln_session_cancel(self.raw.ptr) };
    }

    /// Tokens the session holds, as of its last completed token.
    pub fn n_tokens(&self) -> usize {
        unsafe { sys::kiln_session_n_tokens(self.raw.ptr) }
    }
}

/// The output of a submitted request since the last poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Polled {
    /// Raw UTF-8 bytes (may end inside a character; the next poll continues it).
    pub text: Vec<u8>,
    pub tokens: Vec<i32>,
    /// Tokens generated so far.
    pub n_tokens: i32,
    /// Some once the request has ended and all its output was returned.
    pub done: Option<Result<StopReason>>,
}

/// A blocking generate's token callback.
type TokenFn<'f> = dyn FnMut(i32, &str) -> ControlFlow<()> + 'f;

struct GenerateState<'f> {
    callback: Option<&'f mut TokenFn<'f>>,
    text: Vec<u8>,
    tokens: Vec<i32>,
    decoder: Utf8Decoder,
    panic: Option<Panic>,
}

unsafe extern "C" fn generate_trampoline(
    token: i32,
    piece: *const c_char,
    len: usize,
    user_data: *mut c_void,
) -> c_int {
    let state = &mut *(user_data as *mut GenerateState<'_>);
    let bytes = if len == 0 { &[][..] } else { std::slice::from_raw_parts(piece.cast::<u8>(), len) };
    state.text.extend_from_slice(bytes);
    if token >= 0 {
        state.tokens.push(token);
    }
    let callback = match state.callback.as_mut() {
        Some(callback) => callback,
        None => return 0,
    };
    let text = state.decoder.push(bytes, token < 0);
    guarded(&mut state.panic, 1, || stop_code(callback(token, &text)))
}

/// Stop strings as the C API takes them: the CStrings and the array of their pointers.
fn stop_strings(stop: &[&str]) -> Result<(Vec<CString>, Vec<*const c_char>)> {
    let owned = stop.iter().map(|s| c_string(s, "a stop string")).collect::<Result<Vec<_>>>()?;
    let ptrs = owned.iter().map(|s| s.as_ptr()).collect();
    Ok((owned, ptrs))
}

impl Session {
    fn create(cache: &Cache, sampler: Option<&Sampler>) -> Result<Session> {
        let mut raw = ptr::null_mut();
        let sampler = sampler.map_or(ptr::null(), |s| s.ptr as *const _);
        check(unsafe { sys::kiln_session_create(cache.model.ptr(), cache.raw.ptr, sampler, &mut raw) })?;
        Ok(Session::wrap(cache, raw))
    }

    fn wrap(cache: &Cache, ptr: *mut sys::kiln_session) -> Session {
        Session {
            raw: Arc::new(SessionRaw {
                ptr,
                request: Mutex::new(ptr::null_mut()),
                request_panic: Arc::new(Mutex::new(None)),
                strategy: Mutex::new(None),
                _cache: cache.raw.clone(),
            }),
            cache: cache.clone(),
            _not_sync: PhantomData,
        }
    }

    fn ptr(&self) -> *mut sys::kiln_session {
        self.raw.ptr
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// A handle that cancels this session from another thread.
    pub fn canceller(&self) -> Canceller {
        Canceller { raw: self.raw.clone() }
    }

    /// Stops the call or request in flight (from a callback of this session, for example).
    pub fn cancel(&self) {
        unsafe { sys::kiln_session_cancel(self.ptr()) };
    }

    /// Tokenizes and appends text, computing it (prefill).
    pub fn append(&mut self, text: &str, flags: TokenizeFlags) -> Result<()> {
        check(unsafe { sys::kiln_session_append_text(self.ptr(), text.as_ptr().cast(), text.len(), flags.0) })
    }

    pub fn append_tokens(&mut self, tokens: &[i32]) -> Result<()> {
        check(unsafe { sys::kiln_session_append_tokens(self.ptr(), tokens.as_ptr(), tokens.len()) })
    }

    /// Appends `tokens` (at least 2) and returns the log-probability of each after the first.
    pub fn score(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        let mut out = vec![0f32; tokens.len().saturating_sub(1).max(1)];
        check(unsafe {
            sys::kiln_session_append_tokens_scored(
                self.ptr(),
                tokens.as_ptr(),
                tokens.len(),
                out.as_mut_ptr(),
            )
        })?;
        out.truncate(tokens.len().saturating_sub(1));
        Ok(out)
    }

    /// Tokens held (prompt and generated).
    pub fn n_tokens(&self) -> usize {
        unsafe { sys::kiln_session_n_tokens(self.ptr()) }
    }

    pub fn tokens(&self) -> Result<Vec<i32>> {
        sized_call(self.n_tokens(), |buf, cap, n| unsafe {
            sys::kiln_session_get_tokens(self.ptr(), buf, cap, n)
        })
    }

    /// A copy of the next-token logits [n_vocab].
    pub fn logits(&self) -> Result<Vec<f32>> {
        let mut p = ptr::null();
        let mut n = 0i32;
        check(unsafe { sys::kiln_session_get_logits(self.ptr(), &mut p, &mut n) })?;
        // SAFETY: valid until the next call on the session; this &self call is the only one
        // (Session is not Sync).
        Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec())
    }

    /// Top log-probabilities (highest first) of the last generated token's distribution
    /// ([`SamplerOptions::n_logprobs`] entries).
    pub fn logprobs(&self) -> Result<Vec<TokenLogprob>> {
        let raw = sized_call(16, |buf: *mut sys::kiln_token_logprob, cap, n| unsafe {
            sys::kiln_session_get_logprobs(self.ptr(), buf, cap, n)
        })?;
        Ok(raw.into_iter().map(|e| TokenLogprob { token: e.token, logprob: e.logprob }).collect())
    }

    /// Removes the last `n_tokens` tokens.
    pub fn rewind(&mut self, n_tokens: usize) -> Result<()> {
        check(unsafe { sys::kiln_session_rewind(self.ptr(), n_tokens) })
    }

    /// A new session with the same tokens (blocks shared copy-on-write), sampler and random
    /// state; with a strategy, the fork gets its own clone of it.
    pub fn fork(&mut self) -> Result<Session> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::kiln_session_fork(self.ptr(), &mut raw) })?;
        Ok(Session::wrap(&self.cache, raw))
    }

    /// Generates up to `options.max_tokens` tokens (blocking).
    pub fn generate(&mut self, options: &RequestOptions<'_>) -> Result<Generated> {
        self.generate_impl(options, None)
    }

    /// As [`Session::generate`], calling `callback(token, text)` for each token with the whole
    /// UTF-8 characters it completed (token -1: held-back text at the end); `ControlFlow::Break`
    /// stops (StopReason::Callback). A panic in the callback stops the generate and resumes
    /// here once kiln has returned.
    pub fn generate_with(
        &mut self,
        options: &RequestOptions<'_>,
        mut callback: impl FnMut(i32, &str) -> ControlFlow<()>,
    ) -> Result<Generated> {
        self.generate_impl(options, Some(&mut callback))
    }

    fn generate_impl<'a>(
        &mut self,
        options: &RequestOptions<'_>,
        callback: Option<&'a mut TokenFn<'a>>,
    ) -> Result<Generated> {
        let (_stop, stop_ptrs) = stop_strings(options.stop)?;
        let mut state = GenerateState {
            callback,
            text: Vec::new(),
            tokens: Vec::new(),
            decoder: Utf8Decoder::default(),
            panic: None,
        };
        let mut p = init_params::<sys::kiln_generate_params>(sys::kiln_generate_params_init);
        p.max_tokens = options.max_tokens;
        p.stop_strings = if stop_ptrs.is_empty() { ptr::null() } else { stop_ptrs.as_ptr() };
        p.n_stop_strings = stop_ptrs.len();
        p.callback = Some(generate_trampoline);
        p.user_data = &mut state as *mut GenerateState<'_> as *mut c_void;
        let mut r: sys::kiln_generate_result = output();
        let code = unsafe { sys::kiln_session_generate(self.ptr(), &p, &mut r) };
        if let Some(panic) = state.panic.take() {
            resume_unwind(panic);
        }
        check(code)?;
        Ok(Generated {
            text: String::from_utf8_lossy(&state.text).into_owned(),
            tokens: state.tokens,
            n_tokens: r.n_tokens,
            stop_reason: StopReason::from_raw(r.stop_reason),
        })
    }

    /// Starts a request (append the prompt, then generate) and returns at once. It runs as the
    /// cache is stepped ([`Cache::step`], [`Cache::start_worker`], or a blocking call on another
    /// session); read it with [`Session::poll`]. Until it is done, other calls fail with
    /// [`Status::Busy`].
    pub fn submit(&mut self, options: &RequestOptions<'_>) -> Result<()> {
        self.submit_with(options, RequestCallbacks::default())
    }

    /// As [`Session::submit`], with callbacks.
    pub fn submit_with(&mut self, options: &RequestOptions<'_>, callbacks: RequestCallbacks) -> Result<()> {
        let (stop, stop_ptrs) = stop_strings(options.stop)?;
        let has_token_callback = callbacks.on_token.is_some();
        let has_done_callback = callbacks.on_done.is_some();
        let state = Box::new(RequestState {
            _text: options.text.unwrap_or("").as_bytes().to_vec(),
            _tokens: options.tokens.to_vec(),
            _stop: stop,
            _stop_ptrs: stop_ptrs,
            on_token: callbacks.on_token,
            on_done: callbacks.on_done,
            decoder: Utf8Decoder::default(),
            panic: self.raw.request_panic.clone(),
        });
        let mut p = init_params::<sys::kiln_request_params>(sys::kiln_request_params_init);
        if options.text.is_some() {
            p.text = state._text.as_ptr().cast();
            p.text_len = state._text.len();
        }
        p.text_flags = options.text_flags.0;
        if !state._tokens.is_empty() {
            p.tokens = state._tokens.as_ptr();
            p.n_tokens = state._tokens.len();
        }
        p.max_tokens = options.max_tokens;
        if !state._stop_ptrs.is_empty() {
            p.stop_strings = state._stop_ptrs.as_ptr();
            p.n_stop_strings = state._stop_ptrs.len();
        }
        if has_token_callback {
            p.on_token = Some(request_token_trampoline);
        }
        if has_done_callback {
            p.on_done = Some(request_done_trampoline);
        }
        // From here on only through the raw pointer, which kiln keeps until the request ends.
        let state = Box::into_raw(state);
        p.user_data = state as *mut c_void;
        if let Err(e) = check(unsafe { sys::kiln_session_submit(self.ptr(), &p) }) {
            unsafe { SessionRaw::free_request(state) }; // refused: kiln never saw it
            return Err(e);
        }
        // Accepted, so the previous request (if any) has ended: its state may go.
        let previous =
            std::mem::replace(&mut *self.raw.request.lock().unwrap_or_else(|e| e.into_inner()), state);
        unsafe { SessionRaw::free_request(previous) };
        Ok(())
    }

    /// Takes the submitted request's output since the last poll. Never blocks on a step. A panic
    /// caught in the request's callbacks resumes here.
    pub fn poll(&mut self) -> Result<Polled> {
        let mut text = Vec::new();
        let mut tokens = Vec::new();
        loop {
            let mut buf = [0u8; 4096];
            let mut ids = [0i32; 256];
            let mut r: sys::kiln_poll_result = output();
            check(unsafe {
                sys::kiln_session_poll(
                    self.ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    ids.as_mut_ptr(),
                    ids.len(),
                    &mut r,
                )
            })?;
            text.extend_from_slice(&buf[..r.text_len]);
            tokens.extend_from_slice(&ids[..r.n_new_tokens]);
            // More queued than the buffers took: poll again (done is reported with the last part).
            if r.done == 0 && (r.text_left > 0 || r.tokens_left > 0) {
                continue;
            }
            let done = (r.done != 0).then(|| match r.status {
                sys::KILN_OK => Ok(StopReason::from_raw(r.stop_reason)),
                status => Err(Error::last(status)),
            });
            self.resume_request_panic();
            return Ok(Polled { text, tokens, n_tokens: r.n_tokens, done });
        }
    }

    fn resume_request_panic(&self) {
        let panic = self.raw.request_panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(panic) = panic {
            resume_unwind(panic);
        }
    }

    /// Generates as an iterator of text pieces (whole UTF-8 characters) through submit/poll: each
    /// `next()` steps the cache on this thread (or waits for the worker's step) until text
    /// arrives. Dropping the iterator early cancels the request and waits for it to end.
    pub fn stream(&mut self, options: &RequestOptions<'_>) -> Result<Stream<'_>> {
        self.submit(options)?;
        Ok(Stream { session: self, decoder: Utf8Decoder::default(), tokens: Vec::new(), outcome: None })
    }

    /// Attaches a speculative strategy (None: plain decoding) and returns the one it replaces.
    pub fn set_strategy(&mut self, strategy: Option<Strategy>) -> Result<Option<Strategy>> {
        let raw = strategy.as_ref().map_or(ptr::null_mut(), |s| s.ptr);
        check(unsafe { sys::kiln_session_set_strategy(self.ptr(), raw) })?;
        let mut slot = self.raw.strategy.lock().unwrap_or_else(|e| e.into_inner());
        Ok(std::mem::replace(&mut *slot, strategy))
    }

    /// Cumulative speculative-decoding metrics (zeros without a strategy).
    pub fn spec_metrics(&self) -> Result<SpecMetrics> {
        let mut m: sys::kiln_spec_metrics = output();
        check(unsafe { sys::kiln_session_get_spec_metrics(self.ptr(), &mut m) })?;
        Ok(SpecMetrics {
            steps: m.steps,
            drafted: m.drafted,
            accepted: m.accepted,
            generated: m.generated,
            mean_accepted_per_step: m.mean_accepted_per_step,
            target_passes_per_token: m.target_passes_per_token,
        })
    }

    fn state_params(options: &StateOptions) -> sys::kiln_state_params {
        let mut p = init_params::<sys::kiln_state_params>(sys::kiln_state_params_init);
        p.kv = options.kv as i32;
        p.strategy = options.strategy as i32;
        p
    }

    /// The session's state (tokens, K/V unless `options.kv` is false, sampler, strategy).
    pub fn save_state(&mut self, options: &StateOptions) -> Result<Vec<u8>> {
        let p = Session::state_params(options);
        sized_call(0, |buf: *mut u8, cap, n| unsafe {
            sys::kiln_session_save_state(self.ptr(), &p, buf.cast(), cap, n)
        })
    }

    /// Replaces the contents with a saved state; all or nothing.
    pub fn load_state(&mut self, state: &[u8]) -> Result<()> {
        check(unsafe { sys::kiln_session_load_state(self.ptr(), state.as_ptr().cast(), state.len()) })
    }

    pub fn save_state_file(&mut self, path: impl AsRef<Path>, options: &StateOptions) -> Result<()> {
        let path = c_path(path.as_ref())?;
        let p = Session::state_params(options);
        check(unsafe { sys::kiln_session_save_state_file(self.ptr(), &p, path.as_ptr()) })
    }

    pub fn load_state_file(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = c_path(path.as_ref())?;
        check(unsafe { sys::kiln_session_load_state_file(self.ptr(), path.as_ptr()) })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // With Cancellers alive the C session outlives this handle: end its request now.
        if Arc::strong_count(&self.raw) > 1 {
            self.cancel();
        }
    }
}

/// kiln_state_params; `Default`: K/V and strategy state included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateOptions {
    pub kv: bool,
    pub strategy: bool,
}

impl Default for StateOptions {
    fn default() -> Self {
        StateOptions { kv: true, strategy: true }
    }
}

/// Text pieces of a submitted request ([`Session::stream`]).
pub struct Stream<'s> {
    session: &'s mut Session,
    decoder: Utf8Decoder,
    tokens: Vec<i32>,
    outcome: Option<Result<StopReason>>,
}

impl Stream<'_> {
    /// The token ids received so far.
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    /// How the request ended, once the iterator is exhausted.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.outcome.as_ref().and_then(|o| o.as_ref().ok().copied())
    }
}

impl Iterator for Stream<'_> {
    type Item = Result<String>;

    fn next(&mut self) -> Option<Result<String>> {
        while self.outcome.is_none() {
            let polled = match self.session.poll() {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            self.tokens.extend_from_slice(&polled.tokens);
            let done = polled.done.is_some();
            let text = self.decoder.push(&polled.text, done);
            if let Some(outcome) = polled.done {
                if let Err(e) = &outcome {
                    self.outcome = Some(Err(e.clone()));
                    return Some(Err(e.clone()));
                }
                self.outcome = Some(outcome);
            }
            if !text.is_empty() {
                return Some(Ok(text));
            }
            if !done {
                if let Err(e) = self.session.cache.step(0.0) {
                    return Some(Err(e));
                }
            }
        }
        None
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        if self.outcome.is_some() {
            return;
        }
        self.session.cancel();
        // Wait for the end, so that the session takes calls again.
        loop {
            match self.session.poll() {
                Ok(Polled { done: Some(_), .. }) | Err(_) => return,
                Ok(_) => {
                    let _ = self.session.cache.step(0.0);
                }
            }
        }
    }
}
