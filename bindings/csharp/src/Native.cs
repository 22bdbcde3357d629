// The raw declarations of include/kiln/kiln.h. Struct layouts follow the header field for field
// (LayoutKind.Sequential gives C's natural alignment); the tests pin every struct's size.
using System;
using System.Runtime.InteropServices;

namespace Kiln
{
    internal static class Native
    {
        // "kiln" resolves to libkiln.so (Linux, via LD_LIBRARY_PATH or the loader's paths),
        // kiln.dll (Windows) or libkiln.dylib.
        private const string Lib = "kiln";

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate int ProgressFn(float progress, IntPtr userData);

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate void DoneFn(IntPtr session, int status, int reason, int nTokens, IntPtr userData);

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate void LogFn(int level, IntPtr message, IntPtr userData);

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate int TokenFn(int token, IntPtr piece, UIntPtr pieceLen, IntPtr userData);

        [StructLayout(LayoutKind.Sequential)]
        internal struct ModelParams
        {
            public uint StructSize;
            public IntPtr Path;
            public int UseMmap;
            public IntPtr Progress;
            public IntPtr ProgressUserData;
            public IntPtr Log;
            public IntPtr LogUserData;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct ModelInfo
        {
            public uint StructSize;
            public IntPtr Architecture;
            public IntPtr Name;
            public long NParams, SizeBytes;
            public int NVocab, NCtxTrain, NEmbd, NLayer, NHead, NHeadKv, HeadDim, NFf;
            public int TokenBos, TokenEos, TokenEot;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct ChatMessage
        {
            public IntPtr Role;
            public IntPtr Content;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct CacheParams
        {
            public uint StructSize;
            public UIntPtr PoolBytes;
            public int BlockSize, KvType, PrefixCaching, NCtx, NThreads, LlamaCppOrder;
            public int StepTokens, Backend, CudaDevice, MlaPrefill;
            public int SlidingWindowSessions; // no longer read
            public int SwaFull;
            public int PinThreads;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct CacheStats
        {
            public uint StructSize;
            public int NCtx, BlockSize, BlocksTotal, BlocksFree, BlocksUsed, BlocksCached, NSequences;
            public long PrefixLookups, PrefixQueryTokens, PrefixHitTokens, Evictions;
            public UIntPtr BytesPerToken, BlockBytes, KvBytesInUse;
            public int SlidingBlocksTotal, SlidingBlocksUsed;
            public long SlidingBlocksReleased;
            public UIntPtr SlidingBlockBytes;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct LogitBias
        {
            public int Token;
            public float Bias;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct SamplerParams
        {
            public uint StructSize;
            public float Temperature;
            public int TopK;
            public float TopP, MinP, TypicalP, RepeatPenalty, FrequencyPenalty, PresencePenalty;
            public int PenaltyLastN;
            public ulong Seed;
            public int NLogprobs;
            public IntPtr LogitBias;
            public UIntPtr NLogitBias;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct GenerateParams
        {
            public uint StructSize;
            public int MaxTokens;
            public IntPtr StopStrings;
            public UIntPtr NStopStrings;
            public IntPtr Callback;
            public IntPtr UserData;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct GenerateResult
        {
            public uint StructSize;
            public int NTokens;
            public int StopReason;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct TokenLogprob
        {
            public int Token;
            public float Logprob;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct RequestParams
        {
            public uint StructSize;
            public IntPtr Text;
            public UIntPtr TextLen;
            public uint TextFlags;
            public IntPtr Tokens;
            public UIntPtr NTokens;
            public int MaxTokens;
            public IntPtr StopStrings;
            public UIntPtr NStopStrings;
            public IntPtr OnToken, OnDone, UserData;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct PollResult
        {
            public uint StructSize;
            public UIntPtr TextLen, NNewTokens, TextLeft, TokensLeft;
            public int Done, Status, StopReason, NTokens;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct StepParams
        {
            public uint StructSize;
            public double TimeBudgetMs;
            public int StepTokens;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct StepResult
        {
            public uint StructSize;
            public int NSteps;
            public long NTokens;
            public int NActive;
            public double ElapsedMs;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct StateParams
        {
            public uint StructSize;
            public int Kv, Strategy;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct NgramParams
        {
            public uint StructSize;
            public int MaxNgram, MinNgram, MaxDraft, StartDraft, MaxSkip, Adaptive;
            public double FixedPassCostBeta;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct DraftParams
        {
            public uint StructSize;
            public int MaxDraft, Adaptive, NThreads, NCtx;
            public double FixedPassCostBeta;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct MedusaParams
        {
            public uint StructSize;
            public int MaxDraft, NThreads, MergeNgram;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct EagleParams
        {
            public uint StructSize;
            public int TopK, MaxDepth, TreeTokens, NThreads, MergeNgram;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct SpecMetrics
        {
            public uint StructSize;
            public long Steps, Drafted, Accepted, Generated;
            public double MeanAcceptedPerStep, TargetPassesPerToken;
        }

        [DllImport(Lib)] internal static extern IntPtr kiln_version();
        [DllImport(Lib)] internal static extern int kiln_abi_version();
        [DllImport(Lib)] internal static extern IntPtr kiln_cpu_info();
        [DllImport(Lib)] internal static extern IntPtr kiln_backends();
        [DllImport(Lib)] internal static extern IntPtr kiln_status_name(int status);
        [DllImport(Lib)] internal static extern IntPtr kiln_last_error_message();

        [DllImport(Lib)] internal static extern int kiln_model_params_init(ref ModelParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_model_load(ref ModelParams p, out IntPtr model);
        [DllImport(Lib)] internal static extern void kiln_model_destroy(IntPtr model);
        [DllImport(Lib)] internal static extern int kiln_model_get_info(ModelHandle model, ref ModelInfo info);
        [DllImport(Lib)] internal static extern int kiln_model_meta_get(ModelHandle model, byte[] key, out IntPtr value);
        [DllImport(Lib)] internal static extern int kiln_model_token_is_eog(ModelHandle model, int token);
        [DllImport(Lib)] internal static extern UIntPtr kiln_model_meta_count(ModelHandle model);
        [DllImport(Lib)] internal static extern int kiln_model_meta_at(ModelHandle model, UIntPtr index, out IntPtr key, out IntPtr value);

        [DllImport(Lib)] internal static extern int kiln_gguf_open(byte[] path, out IntPtr gguf);
        [DllImport(Lib)] internal static extern void kiln_gguf_destroy(IntPtr gguf);
        [DllImport(Lib)] internal static extern UIntPtr kiln_gguf_meta_count(GgufHandle gguf);
        [DllImport(Lib)] internal static extern int kiln_gguf_meta_at(GgufHandle gguf, UIntPtr index, out IntPtr key, out IntPtr value);
        [DllImport(Lib)] internal static extern IntPtr kiln_gguf_unsupported(GgufHandle gguf);

        [DllImport(Lib)]
        internal static extern int kiln_tokenize(ModelHandle model, byte[] text, UIntPtr textLen, uint flags,
                                                 int[] tokens, UIntPtr capacity, out UIntPtr nTokens);
        [DllImport(Lib)]
        internal static extern int kiln_detokenize(ModelHandle model, int[] tokens, UIntPtr nTokens, uint flags,
                                                   byte[] text, UIntPtr capacity, out UIntPtr textLen);
        [DllImport(Lib)]
        internal static extern int kiln_chat_apply_template(ModelHandle model, byte[] tmpl, ChatMessage[] messages,
                                                            UIntPtr nMessages, int addGenerationPrompt, byte[] text,
                                                            UIntPtr capacity, out UIntPtr textLen);

        [DllImport(Lib)] internal static extern int kiln_cache_params_init(ref CacheParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_cache_create(ModelHandle model, ref CacheParams p, out IntPtr cache);
        [DllImport(Lib)] internal static extern void kiln_cache_destroy(IntPtr cache);
        [DllImport(Lib)] internal static extern IntPtr kiln_cache_backend(CacheHandle cache);
        [DllImport(Lib)] internal static extern int kiln_cache_get_stats(CacheHandle cache, ref CacheStats stats);
        [DllImport(Lib)] internal static extern int kiln_step_params_init(ref StepParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_cache_step(CacheHandle cache, ref StepParams p, ref StepResult r);
        [DllImport(Lib)] internal static extern int kiln_cache_start_worker(CacheHandle cache);
        [DllImport(Lib)] internal static extern int kiln_cache_stop_worker(CacheHandle cache);

        [DllImport(Lib)] internal static extern int kiln_sampler_params_init(ref SamplerParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_sampler_create(ref SamplerParams p, out IntPtr sampler);
        [DllImport(Lib)] internal static extern void kiln_sampler_destroy(IntPtr sampler);

        [DllImport(Lib)]
        internal static extern int kiln_session_create(ModelHandle model, CacheHandle cache, IntPtr sampler,
                                                       out IntPtr session);
        [DllImport(Lib)] internal static extern void kiln_session_destroy(IntPtr session);
        [DllImport(Lib)] internal static extern int kiln_session_append_text(SessionHandle s, byte[] text, UIntPtr len, uint flags);
        [DllImport(Lib)] internal static extern int kiln_session_append_tokens(SessionHandle s, int[] tokens, UIntPtr n);
        [DllImport(Lib)] internal static extern int kiln_session_append_tokens_scored(SessionHandle s, int[] tokens, UIntPtr n, [Out] float[] logprobs);
        [DllImport(Lib)] internal static extern int kiln_generate_params_init(ref GenerateParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_session_generate(SessionHandle s, ref GenerateParams p, ref GenerateResult r);
        [DllImport(Lib)] internal static extern int kiln_session_cancel(SessionHandle s);
        [DllImport(Lib)] internal static extern int kiln_session_fork(SessionHandle s, out IntPtr fork);
        [DllImport(Lib)] internal static extern int kiln_session_rewind(SessionHandle s, UIntPtr n);
        [DllImport(Lib)] internal static extern UIntPtr kiln_session_n_tokens(SessionHandle s);
        [DllImport(Lib)] internal static extern int kiln_session_get_tokens(SessionHandle s, int[] tokens, UIntPtr capacity, out UIntPtr n);
        [DllImport(Lib)] internal static extern int kiln_session_get_logits(SessionHandle s, out IntPtr logits, out int nVocab);
        [DllImport(Lib)] internal static extern int kiln_session_get_logprobs(SessionHandle s, [Out] TokenLogprob[] o, UIntPtr capacity, out UIntPtr n);

        [DllImport(Lib)] internal static extern int kiln_request_params_init(ref RequestParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_session_submit(SessionHandle s, ref RequestParams p);
        [DllImport(Lib)]
        internal static extern int kiln_session_poll(SessionHandle s, byte[] text, UIntPtr textCapacity, int[] tokens,
                                                     UIntPtr tokenCapacity, ref PollResult r);

        [DllImport(Lib)] internal static extern int kiln_state_params_init(ref StateParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_session_save_state(SessionHandle s, ref StateParams p, byte[] buffer, UIntPtr capacity, out UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_session_load_state(SessionHandle s, byte[] state, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_session_save_state_file(SessionHandle s, ref StateParams p, byte[] path);
        [DllImport(Lib)] internal static extern int kiln_session_load_state_file(SessionHandle s, byte[] path);

        [DllImport(Lib)] internal static extern int kiln_ngram_params_init(ref NgramParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_strategy_create_ngram(ref NgramParams p, out IntPtr strategy);
        [DllImport(Lib)] internal static extern int kiln_draft_params_init(ref DraftParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_strategy_create_draft(ModelHandle target, byte[] path, ref DraftParams p, out IntPtr strategy);
        [DllImport(Lib)] internal static extern int kiln_medusa_params_init(ref MedusaParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_strategy_create_medusa(ModelHandle target, byte[] path, ref MedusaParams p, out IntPtr strategy);
        [DllImport(Lib)] internal static extern int kiln_eagle_params_init(ref EagleParams p, UIntPtr size);
        [DllImport(Lib)] internal static extern int kiln_strategy_create_eagle(ModelHandle target, byte[] path, ref EagleParams p, out IntPtr strategy);
        [DllImport(Lib)] internal static extern void kiln_strategy_destroy(IntPtr strategy);
        [DllImport(Lib)] internal static extern int kiln_session_set_strategy(SessionHandle s, IntPtr strategy);
        [DllImport(Lib)] internal static extern int kiln_session_get_spec_metrics(SessionHandle s, ref SpecMetrics m);

        internal static UIntPtr SizeOf<T>() where T : struct { return (UIntPtr)Marshal.SizeOf(typeof(T)); }
    }
}
