using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;

namespace Kiln
{
    /// <summary>Library-wide queries.</summary>
    public static class KilnLibrary
    {
        public static string Version { get { return Marshal.PtrToStringAnsi(Native.kiln_version()); } }
        public static int AbiVersion { get { return Native.kiln_abi_version(); } }
        public static string CpuInfo { get { return Marshal.PtrToStringAnsi(Native.kiln_cpu_info()); } }
        public static string Backends { get { return Interop.Utf8String(Native.kiln_backends()); } }
    }

    /// <summary>Flags of Tokenize and Session.Append.</summary>
    [Flags]
    public enum TokenizeFlags : uint
    {
        None = 0,
        AddSpecial = 1,   // add BOS/EOS as the vocabulary asks
        ParseSpecial = 2, // "<|im_start|>" in the text becomes the control token
    }

    /// <summary>Severity of a log line (kiln_log_level).</summary>
    public enum LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 }

    public sealed class ModelInfo
    {
        public string Architecture, Name;
        public long NParams, SizeBytes;
        public int NVocab, NCtxTrain, NEmbd, NLayer, NHead, NHeadKv, HeadDim, NFf, TokenBos, TokenEos, TokenEot;
    }

    /// <summary>A loaded GGUF model: immutable, usable from any thread. Dispose it last (its caches
    /// keep it alive until they are disposed).</summary>
    public sealed class Model : IDisposable
    {
        internal readonly ModelHandle Handle;

        /// <summary>Loads the model. progress receives [0, 1] and returns false to cancel;
        /// cancelling the token cancels the load (KilnCancelledException). log receives the load's
        /// log lines on this thread (a failed load logs its error message at LogLevel.Error).
        /// </summary>
        public Model(string path, Func<float, bool> progress = null, CancellationToken cancellation = default(CancellationToken),
                     Action<LogLevel, string> log = null)
        {
            if (path == null) throw new ArgumentNullException("path");
            cancellation.ThrowIfCancellationRequested();
            var p = new Native.ModelParams();
            Interop.Check(Native.kiln_model_params_init(ref p, Native.SizeOf<Native.ModelParams>()));
            Exception callbackError = null;
            // Kept in a local until the call returns so the GC cannot collect the delegate.
            Native.ProgressFn fn = (value, _) =>
            {
                if (cancellation.IsCancellationRequested) return 1;
                if (progress == null) return 0;
                try { return progress(value) ? 0 : 1; }
                catch (Exception e) { callbackError = e; return 1; }
            };
            p.Progress = Marshal.GetFunctionPointerForDelegate(fn);
            Native.LogFn logFn = (level, message, _) =>
            {
                if (callbackError != null) return;
                try { log((LogLevel)level, Interop.Utf8String(message)); }
                catch (Exception e) { callbackError = e; }
            };
            if (log != null) p.Log = Marshal.GetFunctionPointerForDelegate(logFn);
            p.Path = Interop.AllocCString(path);
            IntPtr raw;
            int status;
            try { status = Native.kiln_model_load(ref p, out raw); }
            finally { Marshal.FreeHGlobal(p.Path); GC.KeepAlive(fn); GC.KeepAlive(logFn); }
            if (callbackError != null)
            {
                Native.kiln_model_destroy(raw); // loaded anyway (a log callback cannot stop it)
                throw callbackError;
            }
            if (status == (int)Status.Cancelled && cancellation.IsCancellationRequested)
                throw new KilnCancelledException("model load cancelled");
            Interop.Check(status);
            Handle = new ModelHandle();
            Handle.Adopt(raw, null);
        }

        public void Dispose() { Handle.Dispose(); }

        public ModelInfo Info
        {
            get
            {
                var i = new Native.ModelInfo { StructSize = (uint)Marshal.SizeOf(typeof(Native.ModelInfo)) };
                Interop.Check(Native.kiln_model_get_info(Handle, ref i));
                return new ModelInfo
                {
                    Architecture = Interop.Utf8String(i.Architecture), Name = Interop.Utf8String(i.Name),
                    NParams = i.NParams, SizeBytes = i.SizeBytes, NVocab = i.NVocab, NCtxTrain = i.NCtxTrain,
                    NEmbd = i.NEmbd, NLayer = i.NLayer, NHead = i.NHead, NHeadKv = i.NHeadKv, HeadDim = i.HeadDim,
                    NFf = i.NFf, TokenBos = i.TokenBos, TokenEos = i.TokenEos, TokenEot = i.TokenEot,
                };
            }
        }

        /// <summary>The metadata value of key as text, or null when absent.</summary>
        public string Meta(string key)
        {
            IntPtr value;
            return Native.kiln_model_meta_get(Handle, Interop.CString(key), out value) == 0
                ? Interop.Utf8String(value) : null;
        }

        /// <summary>Every GGUF metadata entry (key, value rendered as text) in file order.</summary>
        public IList<KeyValuePair<string, string>> Metadata
        {
            get
            {
                return Interop.MetaEntries((int)Native.kiln_model_meta_count(Handle),
                    (UIntPtr i, out IntPtr k, out IntPtr v) => Native.kiln_model_meta_at(Handle, i, out k, out v));
            }
        }

        public bool IsEndOfGeneration(int token) { return Native.kiln_model_token_is_eog(Handle, token) != 0; }

        public int[] Tokenize(string text, TokenizeFlags flags = TokenizeFlags.None)
        {
            byte[] bytes = Encoding.UTF8.GetBytes(text ?? "");
            var tokens = new int[bytes.Length + 8];
            while (true)
            {
                UIntPtr n;
                int status = Native.kiln_tokenize(Handle, bytes, (UIntPtr)bytes.Length, (uint)flags, tokens,
                                                  (UIntPtr)tokens.Length, out n);
                if (status == (int)Status.BufferTooSmall) { tokens = new int[(int)n]; continue; }
                Interop.Check(status);
                Array.Resize(ref tokens, (int)n);
                return tokens;
            }
        }

        public string Detokenize(int[] tokens, bool renderSpecial = false)
        {
            var text = new byte[16 * tokens.Length + 16];
            while (true)
            {
                UIntPtr n;
                int status = Native.kiln_detokenize(Handle, tokens, (UIntPtr)tokens.Length, renderSpecial ? 1u : 0u,
                                                    text, (UIntPtr)text.Length, out n);
                if (status == (int)Status.BufferTooSmall) { text = new byte[(int)n]; continue; }
                Interop.Check(status);
                return Encoding.UTF8.GetString(text, 0, (int)n);
            }
        }

        /// <summary>Renders (role, content) messages with the model's template (template null) or
        /// a family name ("chatml", "llama3", ...) or Jinja source.</summary>
        public string ApplyChatTemplate(IList<KeyValuePair<string, string>> messages, string template = null,
                                        bool addGenerationPrompt = true)
        {
            var cmsgs = new Native.ChatMessage[messages.Count];
            try
            {
                for (int i = 0; i < cmsgs.Length; i++)
                {
                    cmsgs[i].Role = Interop.AllocCString(messages[i].Key);
                    cmsgs[i].Content = Interop.AllocCString(messages[i].Value);
                }
                var text = new byte[1024];
                while (true)
                {
                    UIntPtr n;
                    int status = Native.kiln_chat_apply_template(Handle, Interop.CString(template), cmsgs,
                        (UIntPtr)cmsgs.Length, addGenerationPrompt ? 1 : 0, text, (UIntPtr)text.Length, out n);
                    if (status == (int)Status.BufferTooSmall) { text = new byte[(int)n]; continue; }
                    Interop.Check(status);
                    return Encoding.UTF8.GetString(text, 0, (int)n);
                }
            }
            finally
            {
                foreach (var m in cmsgs) { Marshal.FreeHGlobal(m.Role); Marshal.FreeHGlobal(m.Content); }
            }
        }
    }

    /// <summary>A GGUF file opened for inspection only: its metadata and what kiln lacks to run
    /// it. Works for any valid GGUF, also one of an architecture kiln cannot load.</summary>
    public sealed class GgufFile : IDisposable
    {
        internal readonly GgufHandle Handle;

        /// <summary>Opens and validates path: KilnException(IO) when it cannot be read,
        /// KilnException(Format) when it is not a valid GGUF (naming the field and offset).</summary>
        public GgufFile(string path)
        {
            if (path == null) throw new ArgumentNullException("path");
            IntPtr raw;
            Interop.Check(Native.kiln_gguf_open(Interop.CString(path), out raw));
            Handle = new GgufHandle();
            Handle.Adopt(raw, null);
        }

        public void Dispose() { Handle.Dispose(); }

        /// <summary>Every metadata entry (key, value rendered as text) in file order.</summary>
        public IList<KeyValuePair<string, string>> Metadata
        {
            get
            {
                return Interop.MetaEntries((int)Native.kiln_gguf_meta_count(Handle),
                    (UIntPtr i, out IntPtr k, out IntPtr v) => Native.kiln_gguf_meta_at(Handle, i, out k, out v));
            }
        }

        /// <summary>What kiln lacks to run the file, one problem per entry; empty when it can.</summary>
        public string[] Unsupported
        {
            get
            {
                return Interop.Utf8String(Native.kiln_gguf_unsupported(Handle))
                    .Split(new[] { '\n' }, StringSplitOptions.RemoveEmptyEntries);
            }
        }
    }

    /// <summary>Element type of the stored K/V (kiln_kv_type).</summary>
    public enum KvType { F16 = 0, F32 = 1, BF16 = 2, Q8_0 = 3 /* head size a multiple of 32 */ }

    /// <summary>The compute backend a cache asks for (kiln_backend_kind).</summary>
    public enum Backend { Cpu = 0, Cuda = 1, Auto = 2 /* CUDA when it can run the model, else the CPU */ }

    /// <summary>How MLA models (deepseek2) compute prompt chunks (kiln_mla_prefill); other
    /// models ignore it. Absorbed: as decode steps, every bitwise guarantee holds. Measured: long
    /// chunks decompressed where a measured cost rule says it is faster, equal to float rounding
    /// (a token's last logit bits can depend on how its prompt was chunked).</summary>
    public enum MlaPrefill { Absorbed = 0, Measured = 1 }

    public sealed class CacheOptions
    {
        public int NCtx;        // most tokens per session; 0: the training context
        public int BlockSize;   // 0: 16
        public long PoolBytes;  // 0: one full context
        public int NThreads;    // 0: physical cores
        public bool PrefixCaching = true;
        public KvType KvType = KvType.F16;
        public bool LlamaCppOrder; // reproduce llama.cpp's CPU arithmetic bit for bit (slower)
        public int StepTokens;     // most tokens in one step's forward pass; 0: 512
        /// <summary>Cuda or Auto: the CUDA device CudaDevice when it can run the model, else the
        /// CPU (the cache is created either way; Cache.Backend says which and why).</summary>
        public Backend Backend = Backend.Cpu;
        public int CudaDevice;
        public MlaPrefill MlaPrefill = MlaPrefill.Absorbed;
        /// <summary>Models with sliding-window and global layers (gemma3), CPU backend: false
        /// (default) releases the sliding layers' K/V once every window has left it, back to the
        /// pool; true keeps every layer's K/V (llama.cpp's --swa-full).</summary>
        public bool SwaFull;
        /// <summary>CPU backend: each worker thread on a core of its own (for hosts that step the
        /// cache in short bursts, such as a game loop).</summary>
        public bool PinThreads;
    }

    public struct CacheStats
    {
        public int NCtx, BlockSize, BlocksTotal, BlocksFree, BlocksUsed, BlocksCached, NSequences;
        public long PrefixLookups, PrefixQueryTokens, PrefixHitTokens, Evictions;
        public long BytesPerToken, BlockBytes;
        /// <summary>K/V bytes held by sessions now.</summary>
        public long KvBytesInUse;
        /// <summary>The sliding-window layers' blocks (CacheOptions.SwaFull false; zero otherwise):
        /// 0 (they share the pool), those held (part of BlocksUsed), those released so far because
        /// every window had left them, and BlockBytes.</summary>
        public int SlidingBlocksTotal, SlidingBlocksUsed;
        public long SlidingBlocksReleased, SlidingBlockBytes;
    }

    public struct StepResult
    {
        public int NSteps, NActive;
        public long NTokens;
        public double ElapsedMs;
    }

    /// <summary>A KV cache and the engine that batches its sessions; thread-safe.</summary>
    public sealed class Cache : IDisposable
    {
        internal readonly CacheHandle Handle;
        public Model Model { get; private set; }

        public Cache(Model model, CacheOptions options = null)
        {
            options = options ?? new CacheOptions();
            var p = new Native.CacheParams();
            Interop.Check(Native.kiln_cache_params_init(ref p, Native.SizeOf<Native.CacheParams>()));
            p.NCtx = options.NCtx;
            if (options.BlockSize != 0) p.BlockSize = options.BlockSize;
            p.PoolBytes = (UIntPtr)(ulong)options.PoolBytes;
            p.NThreads = options.NThreads;
            p.PrefixCaching = options.PrefixCaching ? 1 : 0;
            p.KvType = (int)options.KvType;
            p.LlamaCppOrder = options.LlamaCppOrder ? 1 : 0;
            if (options.StepTokens != 0) p.StepTokens = options.StepTokens;
            p.Backend = (int)options.Backend;
            p.CudaDevice = options.CudaDevice;
            p.MlaPrefill = (int)options.MlaPrefill;
            p.SwaFull = options.SwaFull ? 1 : 0;
            p.PinThreads = options.PinThreads ? 1 : 0;
            IntPtr raw;
            Interop.Check(Native.kiln_cache_create(model.Handle, ref p, out raw));
            Handle = new CacheHandle();
            Handle.Adopt(raw, model.Handle);
            Model = model;
        }

        public void Dispose() { Handle.Dispose(); }

        /// <summary>The backend the cache runs on ("cpu (avx2, 4 threads)"), followed by "; cuda
        /// requested, running on the CPU: &lt;reason&gt;" when a CUDA request fell back.</summary>
        public string Backend { get { return Interop.Utf8String(Native.kiln_cache_backend(Handle)); } }

        public CacheStats Stats
        {
            get
            {
                var s = new Native.CacheStats { StructSize = (uint)Marshal.SizeOf(typeof(Native.CacheStats)) };
                Interop.Check(Native.kiln_cache_get_stats(Handle, ref s));
                return new CacheStats
                {
                    NCtx = s.NCtx, BlockSize = s.BlockSize, BlocksTotal = s.BlocksTotal, BlocksFree = s.BlocksFree,
                    BlocksUsed = s.BlocksUsed, BlocksCached = s.BlocksCached, NSequences = s.NSequences,
                    PrefixLookups = s.PrefixLookups, PrefixQueryTokens = s.PrefixQueryTokens,
                    PrefixHitTokens = s.PrefixHitTokens, Evictions = s.Evictions,
                    BytesPerToken = (long)(ulong)s.BytesPerToken, BlockBytes = (long)(ulong)s.BlockBytes,
                    KvBytesInUse = (long)(ulong)s.KvBytesInUse, SlidingBlocksTotal = s.SlidingBlocksTotal,
                    SlidingBlocksUsed = s.SlidingBlocksUsed, SlidingBlocksReleased = s.SlidingBlocksReleased,
                    SlidingBlockBytes = (long)(ulong)s.SlidingBlockBytes,
                };
            }
        }

        public Session CreateSession(SamplerOptions sampler = null) { return new Session(this, sampler); }

        /// <summary>Runs steps on the calling thread: one, or with timeBudgetMs &gt; 0 as many as fit
        /// in that budget (a game loop calls it once per frame); at most stepTokens tokens per
        /// forward pass (0: CacheOptions.StepTokens).</summary>
        public StepResult Step(double timeBudgetMs = 0, int stepTokens = 0)
        {
            var p = new Native.StepParams();
            Interop.Check(Native.kiln_step_params_init(ref p, Native.SizeOf<Native.StepParams>()));
            p.TimeBudgetMs = timeBudgetMs;
            p.StepTokens = stepTokens;
            var r = new Native.StepResult { StructSize = (uint)Marshal.SizeOf(typeof(Native.StepResult)) };
            Interop.Check(Native.kiln_cache_step(Handle, ref p, ref r));
            return new StepResult { NSteps = r.NSteps, NActive = r.NActive, NTokens = r.NTokens, ElapsedMs = r.ElapsedMs };
        }

        public void StartWorker() { Interop.Check(Native.kiln_cache_start_worker(Handle)); }
        public void StopWorker() { Interop.Check(Native.kiln_cache_stop_worker(Handle)); }
    }
}
