using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Kiln
{
    /// <summary>Sampling parameters; the defaults are greedy decoding.</summary>
    public sealed class SamplerOptions
    {
        public float Temperature;      // <= 0: greedy
        public int TopK;               // <= 0: off
        public float TopP = 1;         // >= 1: off
        public float MinP;             // <= 0: off
        public float TypicalP = 1;     // >= 1: off
        public float RepeatPenalty = 1; // 1: off
        public float FrequencyPenalty; // 0: off
        public float PresencePenalty;  // 0: off
        public int PenaltyLastN = 64;  // window of the penalties; 0: off, -1: the whole history
        public ulong Seed;
        public int NLogprobs;          // top log-probabilities kept per sampled token
        /// <summary>Added to the logits of the tokens it names; float.NegativeInfinity bans one.</summary>
        public IDictionary<int, float> LogitBias;
    }

    public enum StopReason { EndOfGeneration = 0, MaxTokens = 1, StopString = 2, Callback = 3, Cancelled = 4, ContextFull = 5 }

    public sealed class GenerateOptions
    {
        public string[] Stop;
        /// <summary>Each token and the text it completed (token -1: held-back text at the end);
        /// return false to stop. Runs on the generating thread, inside the call.</summary>
        public Func<int, string, bool> OnToken;
    }

    public sealed class GenerateResult
    {
        public int[] Tokens;
        public string Text;
        public StopReason StopReason;
    }

    public struct TokenLogprob
    {
        public int Token;
        public float Logprob; // natural log of the raw probability
    }

    public struct SpecMetrics
    {
        public long Steps, Drafted, Accepted, Generated;
        public double MeanAcceptedPerStep, TargetPassesPerToken;
    }

    /// <summary>A non-blocking request: append Text (then Tokens), then generate MaxTokens.</summary>
    public sealed class Request
    {
        public string Text;
        public TokenizeFlags Flags;
        public int[] Tokens;
        public int MaxTokens = 128; // 0: only compute the prompt
        public string[] Stop;
        /// <summary>Each token and the text it completed (whole characters; token -1: held-back
        /// text at the end), on the thread that steps the cache; returning false ends the request
        /// (StopReason.Callback). With OnToken set, Poll returns no text.</summary>
        public Func<int, string, bool> OnToken;
        /// <summary>Called once when the request ends, on the thread that steps the cache: the
        /// error (null on success), the stop reason and the number of generated tokens.</summary>
        public Action<KilnException, StopReason, int> OnDone;
    }

    public sealed class PollResult
    {
        public byte[] Text;     // may end inside a UTF-8 character; the next poll continues it
        public int[] Tokens;
        public bool Done;
        public KilnException Error; // when Done: the request's error, or null
        public StopReason StopReason;
        public int NTokens;
    }

    /// <summary>One conversation on a cache. One thread at a time (a concurrent call throws
    /// KilnException Busy); Cancel, NTokens and Poll from any thread.</summary>
    public sealed class Session : IDisposable
    {
        internal readonly SessionHandle Handle;
        public Cache Cache { get; private set; }
        private Interop.CStringArray _requestStops; // live while a submitted request may match them
        private Exception _callbackError; // thrown by a request's callback; rethrown by Poll

        internal Session(Cache cache, SamplerOptions options)
        {
            IntPtr sampler = IntPtr.Zero;
            if (options != null)
            {
                var p = new Native.SamplerParams();
                Interop.Check(Native.kiln_sampler_params_init(ref p, Native.SizeOf<Native.SamplerParams>()));
                p.Temperature = options.Temperature;
                p.TopK = options.TopK;
                p.TopP = options.TopP;
                p.MinP = options.MinP;
                p.TypicalP = options.TypicalP;
                p.RepeatPenalty = options.RepeatPenalty;
                p.FrequencyPenalty = options.FrequencyPenalty;
                p.PresencePenalty = options.PresencePenalty;
                p.PenaltyLastN = options.PenaltyLastN;
                p.Seed = options.Seed;
                p.NLogprobs = options.NLogprobs;
                var bias = new List<Native.LogitBias>();
                if (options.LogitBias != null)
                    foreach (var kv in options.LogitBias) bias.Add(new Native.LogitBias { Token = kv.Key, Bias = kv.Value });
                // Pinned for the call; kiln_sampler_create copies the array.
                GCHandle pinned = GCHandle.Alloc(bias.ToArray(), GCHandleType.Pinned);
                try
                {
                    p.LogitBias = bias.Count > 0 ? pinned.AddrOfPinnedObject() : IntPtr.Zero;
                    p.NLogitBias = (UIntPtr)bias.Count;
                    Interop.Check(Native.kiln_sampler_create(ref p, out sampler));
                }
                finally { pinned.Free(); }
            }
            IntPtr raw;
            try { Interop.Check(Native.kiln_session_create(cache.Model.Handle, cache.Handle, sampler, out raw)); }
            finally { Native.kiln_sampler_destroy(sampler); } // the session keeps its own copy
            Handle = new SessionHandle();
            Handle.Adopt(raw, cache.Handle);
            Cache = cache;
        }

        private Session(Cache cache, IntPtr raw)
        {
            Handle = new SessionHandle();
            Handle.Adopt(raw, cache.Handle);
            Cache = cache;
        }

        public void Dispose()
        {
            Handle.Dispose();
            if (_requestStops != null) _requestStops.Dispose();
            _requestStops = null;
        }

        /// <summary>Stops the call or request in flight; any thread, any time.</summary>
        public void Cancel() { Native.kiln_session_cancel(Handle); }

        /// <summary>Tokens held (prompt and generated); any thread, any time.</summary>
        public int NTokens { get { return (int)Native.kiln_session_n_tokens(Handle); } }

        private CancellationTokenRegistration CancelOn(CancellationToken token)
        {
            return token.CanBeCanceled ? token.Register(Cancel) : default(CancellationTokenRegistration);
        }

        /// <summary>Tokenizes and appends text, all or nothing; a cancelled token stops it with
        /// KilnCancelledException and the session unchanged.</summary>
        public void Append(string text, TokenizeFlags flags = TokenizeFlags.None,
                           CancellationToken cancellation = default(CancellationToken))
        {
            byte[] bytes = Encoding.UTF8.GetBytes(text ?? "");
            RunCancellable(cancellation, () => Native.kiln_session_append_text(Handle, bytes, (UIntPtr)bytes.Length, (uint)flags));
        }

        public void AppendTokens(int[] tokens, CancellationToken cancellation = default(CancellationToken))
        {
            RunCancellable(cancellation, () => Native.kiln_session_append_tokens(Handle, tokens, (UIntPtr)tokens.Length));
        }

        /// <summary>Appends tokens (at least 2) and returns the natural log-probability of each token
        /// after the first given what precedes it (perplexity scoring).</summary>
        public float[] Score(int[] tokens)
        {
            if (tokens == null) throw new ArgumentNullException("tokens");
            var logprobs = new float[Math.Max(tokens.Length - 1, 0)];
            Interop.Check(Native.kiln_session_append_tokens_scored(Handle, tokens, (UIntPtr)tokens.Length, logprobs));
            return logprobs;
        }

        private void RunCancellable(CancellationToken cancellation, Func<int> call)
        {
            if (cancellation.IsCancellationRequested) throw new KilnCancelledException("cancelled before the call");
            int status;
            using (CancelOn(cancellation)) status = call();
            if (status == (int)Status.Cancelled && cancellation.IsCancellationRequested)
                throw new KilnCancelledException("cancelled through the CancellationToken");
            Interop.Check(status);
        }

        /// <summary>Generates up to maxTokens tokens (kept in the session), streaming them to
        /// options.OnToken. A cancelled token stops it at the next token: like kiln, that is a
        /// success with StopReason.Cancelled and what was made so far.</summary>
        public GenerateResult Generate(int maxTokens, GenerateOptions options = null,
                                       CancellationToken cancellation = default(CancellationToken))
        {
            options = options ?? new GenerateOptions();
            var tokens = new List<int>();
            var text = new List<byte>();
            Decoder decoder = Encoding.UTF8.GetDecoder();
            Exception callbackError = null;
            bool stoppedByCallback = false;
            Native.TokenFn fn = (token, piece, pieceLen, _) =>
            {
                var bytes = new byte[(int)pieceLen];
                if (bytes.Length > 0) Marshal.Copy(piece, bytes, 0, bytes.Length);
                text.AddRange(bytes);
                if (token >= 0) tokens.Add(token);
                if (cancellation.IsCancellationRequested) return 1;
                if (options.OnToken == null) return 0;
                try
                {
                    var chars = new char[decoder.GetCharCount(bytes, 0, bytes.Length, token < 0)];
                    decoder.GetChars(bytes, 0, bytes.Length, chars, 0, token < 0);
                    if (options.OnToken(token, new string(chars))) return 0;
                    stoppedByCallback = true;
                    return 1;
                }
                catch (Exception e) { callbackError = e; return 1; }
            };
            var p = new Native.GenerateParams();
            Interop.Check(Native.kiln_generate_params_init(ref p, Native.SizeOf<Native.GenerateParams>()));
            p.MaxTokens = maxTokens;
            p.Callback = Marshal.GetFunctionPointerForDelegate(fn);
            var r = new Native.GenerateResult { StructSize = (uint)Marshal.SizeOf(typeof(Native.GenerateResult)) };
            int status;
            using (var stops = new Interop.CStringArray(options.Stop))
            {
                p.StopStrings = stops.Pointer;
                p.NStopStrings = (UIntPtr)stops.Count;
                if (cancellation.IsCancellationRequested)
                    return new GenerateResult { Tokens = new int[0], Text = "", StopReason = StopReason.Cancelled };
                using (CancelOn(cancellation)) status = Native.kiln_session_generate(Handle, ref p, ref r);
                GC.KeepAlive(fn);
            }
            if (callbackError != null) throw callbackError;
            Interop.Check(status);
            var reason = (StopReason)r.StopReason;
            // The callback also stops on a cancelled token (kiln drops a cancel that arrives
            // before the call starts): report that as the cancel it is.
            if (reason == StopReason.Callback && !stoppedByCallback && cancellation.IsCancellationRequested)
                reason = StopReason.Cancelled;
            return new GenerateResult
            {
                Tokens = tokens.ToArray(), Text = Encoding.UTF8.GetString(text.ToArray()), StopReason = reason,
            };
        }

        /// <summary>Generate on a thread-pool thread.</summary>
        public Task<GenerateResult> GenerateAsync(int maxTokens, GenerateOptions options = null,
                                                  CancellationToken cancellation = default(CancellationToken))
        {
            return Task.Run(() => Generate(maxTokens, options, cancellation));
        }

        /// <summary>Submits a request and yields its text as it is generated, stepping the cache on
        /// the enumerating thread (or waiting for the worker's steps). Leaving the loop early or
        /// cancelling the token cancels the request; a request that fails throws its
        /// KilnException from the enumeration. result (optional) receives the final poll.</summary>
        public IEnumerable<string> Stream(Request request, CancellationToken cancellation = default(CancellationToken),
                                          Action<PollResult> result = null)
        {
            Submit(request);
            return StreamSubmitted(cancellation, result);
        }

        private IEnumerable<string> StreamSubmitted(CancellationToken cancellation, Action<PollResult> result)
        {
            Decoder decoder = Encoding.UTF8.GetDecoder();
            bool done = false;
            try
            {
                using (CancelOn(cancellation))
                {
                    while (true)
                    {
                        PollResult polled = Poll();
                        var chars = new char[decoder.GetCharCount(polled.Text, 0, polled.Text.Length, polled.Done)];
                        decoder.GetChars(polled.Text, 0, polled.Text.Length, chars, 0, polled.Done);
                        if (chars.Length > 0) yield return new string(chars);
                        if (polled.Done)
                        {
                            done = true;
                            if (result != null) result(polled);
                            if (polled.Error != null) throw polled.Error;
                            yield break;
                        }
                        Cache.Step(5);
                    }
                }
            }
            finally
            {
                if (!done)
                {
                    // Left early: cancel and finish the request so the session takes calls again.
                    Cancel();
                    while (!Poll().Done) Cache.Step(0);
                }
            }
        }

        public Session Fork()
        {
            IntPtr raw;
            Interop.Check(Native.kiln_session_fork(Handle, out raw));
            return new Session(Cache, raw);
        }

        public void Rewind(int nTokens)
        {
            if (nTokens < 0) throw new KilnException(Status.InvalidArgument, "rewind: negative token count");
            Interop.Check(Native.kiln_session_rewind(Handle, (UIntPtr)nTokens));
        }

        public int[] Tokens
        {
            get
            {
                var tokens = new int[NTokens + 1];
                UIntPtr n;
                Interop.Check(Native.kiln_session_get_tokens(Handle, tokens, (UIntPtr)tokens.Length, out n));
                Array.Resize(ref tokens, (int)n);
                return tokens;
            }
        }

        /// <summary>A copy of the next-token logits [n_vocab].</summary>
        public float[] Logits
        {
            get
            {
                IntPtr p;
                int n;
                Interop.Check(Native.kiln_session_get_logits(Handle, out p, out n));
                var logits = new float[n];
                Marshal.Copy(p, logits, 0, n);
                return logits;
            }
        }

        public TokenLogprob[] Logprobs()
        {
            var raw = new Native.TokenLogprob[64];
            while (true)
            {
                UIntPtr n;
                int status = Native.kiln_session_get_logprobs(Handle, raw, (UIntPtr)raw.Length, out n);
                if (status == (int)Status.BufferTooSmall) { raw = new Native.TokenLogprob[(int)n]; continue; }
                Interop.Check(status);
                var result = new TokenLogprob[(int)n];
                for (int i = 0; i < result.Length; i++) result[i] = new TokenLogprob { Token = raw[i].Token, Logprob = raw[i].Logprob };
                return result;
            }
        }

        /// <summary>Attaches strategy (null: plain decoding) to the next generates.</summary>
        public void SetStrategy(Strategy strategy)
        {
            Interop.Check(Native.kiln_session_set_strategy(Handle, strategy == null ? IntPtr.Zero : strategy.Handle.DangerousGetHandle()));
        }

        public SpecMetrics SpecMetrics
        {
            get
            {
                var m = new Native.SpecMetrics { StructSize = (uint)Marshal.SizeOf(typeof(Native.SpecMetrics)) };
                Interop.Check(Native.kiln_session_get_spec_metrics(Handle, ref m));
                return new SpecMetrics
                {
                    Steps = m.Steps, Drafted = m.Drafted, Accepted = m.Accepted, Generated = m.Generated,
                    MeanAcceptedPerStep = m.MeanAcceptedPerStep, TargetPassesPerToken = m.TargetPassesPerToken,
                };
            }
        }

        /// <summary>Starts a request and returns at once; it runs as the cache is stepped.</summary>
        public void Submit(Request request)
        {
            var p = new Native.RequestParams();
            Interop.Check(Native.kiln_request_params_init(ref p, Native.SizeOf<Native.RequestParams>()));
            byte[] text = Encoding.UTF8.GetBytes(request.Text ?? "");
            int[] tokens = request.Tokens ?? new int[0];
            var callbacks = new RequestCallbacks(this, request);
            var stops = new Interop.CStringArray(request.Stop);
            GCHandle textPin = GCHandle.Alloc(text, GCHandleType.Pinned);
            GCHandle tokensPin = GCHandle.Alloc(tokens, GCHandleType.Pinned);
            int status;
            try
            {
                // The prompt is read during the call only.
                p.Text = text.Length > 0 ? textPin.AddrOfPinnedObject() : IntPtr.Zero;
                p.TextLen = (UIntPtr)text.Length;
                p.TextFlags = (uint)request.Flags;
                p.Tokens = tokens.Length > 0 ? tokensPin.AddrOfPinnedObject() : IntPtr.Zero;
                p.NTokens = (UIntPtr)tokens.Length;
                p.MaxTokens = request.MaxTokens;
                p.StopStrings = stops.Pointer;
                p.NStopStrings = (UIntPtr)stops.Count;
                p.OnToken = callbacks.Token != null ? Marshal.GetFunctionPointerForDelegate(callbacks.Token) : IntPtr.Zero;
                p.OnDone = callbacks.Done != null ? Marshal.GetFunctionPointerForDelegate(callbacks.Done) : IntPtr.Zero;
                status = Native.kiln_session_submit(Handle, ref p);
            }
            finally { textPin.Free(); tokensPin.Free(); }
            if (status != 0) { stops.Dispose(); throw Interop.Error(status); }
            Handle.RequestCallbacks = callbacks;
            if (_requestStops != null) _requestStops.Dispose();
            _requestStops = stops; // matched while the request runs
        }

        private sealed class RequestCallbacks
        {
            public readonly Native.TokenFn Token;
            public readonly Native.DoneFn Done;

            public RequestCallbacks(Session session, Request request)
            {
                // An exception may not unwind into kiln: it ends the request and Poll rethrows it.
                Action<Exception> keep = e => Interlocked.CompareExchange(ref session._callbackError, e, null);
                Func<int, string, bool> onToken = request.OnToken;
                Action<KilnException, StopReason, int> onDone = request.OnDone;
                if (onToken != null)
                {
                    Decoder decoder = Encoding.UTF8.GetDecoder();
                    Token = (token, piece, pieceLen, _) =>
                    {
                        try
                        {
                            var bytes = new byte[(int)pieceLen];
                            if (bytes.Length > 0) Marshal.Copy(piece, bytes, 0, bytes.Length);
                            var chars = new char[decoder.GetCharCount(bytes, 0, bytes.Length, token < 0)];
                            decoder.GetChars(bytes, 0, bytes.Length, chars, 0, token < 0);
                            return onToken(token, new string(chars)) ? 0 : 1;
                        }
                        catch (Exception e) { keep(e); return 1; }
                    };
                }
                if (onDone != null)
                {
                    Done = (_, status, reason, n, __) =>
                    {
                        try { onDone(status != 0 ? Interop.Error(status) : null, status == 0 ? (StopReason)reason : 0, n); }
                        catch (Exception e) { keep(e); }
                    };
                }
            }
        }

        /// <summary>The request's output since the last poll; never blocks on a step. An exception
        /// a request callback threw is rethrown here first (the output stays for the next poll).
        /// </summary>
        public PollResult Poll()
        {
            Exception callbackError = Interlocked.Exchange(ref _callbackError, null);
            if (callbackError != null) throw callbackError;
            var text = new List<byte>();
            var tokens = new List<int>();
            var textBuf = new byte[4096];
            var tokenBuf = new int[256];
            while (true)
            {
                var r = new Native.PollResult { StructSize = (uint)Marshal.SizeOf(typeof(Native.PollResult)) };
                int status = Native.kiln_session_poll(Handle, textBuf, (UIntPtr)textBuf.Length, tokenBuf, (UIntPtr)tokenBuf.Length, ref r);
                Interop.Check(status);
                KilnException error = r.Done != 0 && r.Status != 0 ? Interop.Error(r.Status) : null;
                for (int i = 0; i < (int)r.TextLen; i++) text.Add(textBuf[i]);
                for (int i = 0; i < (int)r.NNewTokens; i++) tokens.Add(tokenBuf[i]);
                if ((ulong)r.TextLeft == 0 && (ulong)r.TokensLeft == 0)
                {
                    return new PollResult
                    {
                        Text = text.ToArray(), Tokens = tokens.ToArray(), Done = r.Done != 0, Error = error,
                        StopReason = error == null ? (StopReason)r.StopReason : 0, NTokens = r.NTokens,
                    };
                }
            }
        }

        /// <summary>The session's state (tokens, K/V unless kv is false, logits, sampler state, the
        /// strategy's adaptive state unless strategy is false: a draft model cannot save it).
        /// </summary>
        public byte[] SaveState(bool kv = true, bool strategy = true)
        {
            var p = StateParams(kv, strategy);
            UIntPtr n;
            int status = Native.kiln_session_save_state(Handle, ref p, null, UIntPtr.Zero, out n);
            if (status != (int)Status.BufferTooSmall) Interop.Check(status);
            var buffer = new byte[(int)n];
            Interop.Check(Native.kiln_session_save_state(Handle, ref p, buffer, (UIntPtr)buffer.Length, out n));
            Array.Resize(ref buffer, (int)n);
            return buffer;
        }

        /// <summary>Replaces the session's contents with a saved state; all or nothing.</summary>
        public void LoadState(byte[] state)
        {
            Interop.Check(Native.kiln_session_load_state(Handle, state, (UIntPtr)state.Length));
        }

        /// <summary>SaveState into the file at path (written beside it, then renamed over it).</summary>
        public void SaveStateFile(string path, bool kv = true, bool strategy = true)
        {
            var p = StateParams(kv, strategy);
            Interop.Check(Native.kiln_session_save_state_file(Handle, ref p, Interop.CString(path)));
        }

        /// <summary>LoadState from the file at path (KilnException(IO) when it cannot be read).</summary>
        public void LoadStateFile(string path)
        {
            Interop.Check(Native.kiln_session_load_state_file(Handle, Interop.CString(path)));
        }

        private static Native.StateParams StateParams(bool kv, bool strategy)
        {
            var p = new Native.StateParams();
            Interop.Check(Native.kiln_state_params_init(ref p, Native.SizeOf<Native.StateParams>()));
            p.Kv = kv ? 1 : 0;
            p.Strategy = strategy ? 1 : 0;
            return p;
        }
    }

    /// <summary>A speculative-decoding strategy (lossless). One session at a time; detach it or
    /// dispose the session before disposing it.</summary>
    public sealed class Strategy : IDisposable
    {
        internal readonly StrategyHandle Handle;

        private Strategy(IntPtr raw, SafeHandle parent)
        {
            Handle = new StrategyHandle();
            Handle.Adopt(raw, parent);
        }

        /// <summary>N-gram prompt lookup; 0 or null keeps a default. maxSkip: plain steps between
        /// probes of the pass cost (0: never); adaptive false: always maxDraft when a match is
        /// found; fixedPassCostBeta &gt;= 0: a pass over w tokens costs 1 + beta (w - 1) one-token
        /// passes, so draft lengths do not depend on timing (null: measured).</summary>
        public static Strategy Ngram(int maxDraft = 0, int maxNgram = 0, int minNgram = 0, int startDraft = 0,
                                     int? maxSkip = null, bool adaptive = true, double? fixedPassCostBeta = null)
        {
            var p = new Native.NgramParams();
            Interop.Check(Native.kiln_ngram_params_init(ref p, Native.SizeOf<Native.NgramParams>()));
            if (maxDraft != 0) { p.MaxDraft = maxDraft; p.StartDraft = Math.Min(p.StartDraft, Math.Max(maxDraft, 1)); }
            if (maxNgram != 0) p.MaxNgram = maxNgram;
            if (minNgram != 0) p.MinNgram = minNgram;
            if (startDraft != 0) p.StartDraft = startDraft;
            if (maxSkip.HasValue) p.MaxSkip = maxSkip.Value;
            p.Adaptive = adaptive ? 1 : 0;
            if (fixedPassCostBeta.HasValue) p.FixedPassCostBeta = fixedPassCostBeta.Value;
            IntPtr raw;
            Interop.Check(Native.kiln_strategy_create_ngram(ref p, out raw));
            return new Strategy(raw, null);
        }

        /// <summary>A draft model from draftPath (the target's vocabulary size); 0 or null keeps a
        /// default. nCtx: longest context drafted for (0: min(training context, 8192)); adaptive
        /// false: a fixed draft length; fixedPassCostBeta as in Ngram.</summary>
        public static Strategy Draft(Model target, string draftPath, int maxDraft = 0, int nThreads = 0, int nCtx = 0,
                                     bool adaptive = true, double? fixedPassCostBeta = null)
        {
            var p = new Native.DraftParams();
            Interop.Check(Native.kiln_draft_params_init(ref p, Native.SizeOf<Native.DraftParams>()));
            if (maxDraft != 0) p.MaxDraft = maxDraft;
            p.NThreads = nThreads;
            p.NCtx = nCtx;
            p.Adaptive = adaptive ? 1 : 0;
            if (fixedPassCostBeta.HasValue) p.FixedPassCostBeta = fixedPassCostBeta.Value;
            IntPtr raw;
            Interop.Check(Native.kiln_strategy_create_draft(target.Handle, Interop.CString(draftPath), ref p, out raw));
            return new Strategy(raw, target.Handle);
        }

        /// <summary>Trained Medusa heads for target from the head file headPath (tools/train/
        /// makes them; the repository's models/ holds one for the default model); 0 keeps a
        /// default (the file's whole tree, one thread). mergeNgram false: without the n-gram
        /// prompt-lookup continuation of the context that kiln merges into every tree by default.
        /// A head trained for another model, or a file that is not a head, throws
        /// KilnException(InvalidArgument) saying what differs; a missing file
        /// KilnException(IO).</summary>
        public static Strategy Medusa(Model target, string headPath, int maxDraft = 0, int nThreads = 0,
                                      bool mergeNgram = true)
        {
            var p = new Native.MedusaParams();
            Interop.Check(Native.kiln_medusa_params_init(ref p, Native.SizeOf<Native.MedusaParams>()));
            if (maxDraft != 0) p.MaxDraft = maxDraft;
            if (nThreads != 0) p.NThreads = nThreads;
            p.MergeNgram = mergeNgram ? 1 : 0;
            IntPtr raw;
            Interop.Check(Native.kiln_strategy_create_medusa(target.Handle, Interop.CString(headPath), ref p, out raw));
            return new Strategy(raw, target.Handle);
        }

        /// <summary>An EAGLE head for target from the head file headPath (architecture "eagle";
        /// kiln-mkeagle writes untrained ones); 0 keeps a default (topK in 1..64, maxDepth in 1..16
        /// and the tree size chosen each step from the measured pass costs, one thread). mergeNgram
        /// false: without the n-gram prompt-lookup continuation of the context that kiln merges into
        /// every tree by default. A head for another model or a file that is not an eagle head
        /// throws KilnException(InvalidArgument), a malformed one KilnException(Format).</summary>
        public static Strategy Eagle(Model target, string headPath, int topK = 0, int maxDepth = 0,
                                     int treeTokens = 0, int nThreads = 0, bool mergeNgram = true)
        {
            var p = new Native.EagleParams();
            Interop.Check(Native.kiln_eagle_params_init(ref p, Native.SizeOf<Native.EagleParams>()));
            if (topK != 0) p.TopK = topK;
            if (maxDepth != 0) p.MaxDepth = maxDepth;
            p.TreeTokens = treeTokens;
            if (nThreads != 0) p.NThreads = nThreads;
            p.MergeNgram = mergeNgram ? 1 : 0;
            IntPtr raw;
            Interop.Check(Native.kiln_strategy_create_eagle(target.Handle, Interop.CString(headPath), ref p, out raw));
            return new Strategy(raw, target.Handle);
        }

        public void Dispose() { Handle.Dispose(); }
    }
}
