// The C# binding on the default model (SmolLM2-135M-Instruct Q4_1 in $KILN_MODEL_DIR or
// ~/.cache/kiln): greedy, about a dozen tokens per generate. A small runner (no NUnit offline):
// every public static void method of Tests whose name starts with "Test" is a test.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;
using Kiln;

internal static class Runner
{
    private static int Main()
    {
        Tests.Setup();
        int failed = 0, passed = 0;
        var total = Stopwatch.StartNew();
        foreach (MethodInfo m in typeof(Tests).GetMethods(BindingFlags.Public | BindingFlags.Static)
                     .Where(m => m.Name.StartsWith("Test")).OrderBy(m => m.MetadataToken))
        {
            var watch = Stopwatch.StartNew();
            try
            {
                m.Invoke(null, null);
                passed++;
                Console.WriteLine("PASS {0} ({1} ms)", m.Name, watch.ElapsedMilliseconds);
            }
            catch (TargetInvocationException e)
            {
                failed++;
                Console.WriteLine("FAIL {0}: {1}", m.Name, e.InnerException);
            }
        }
        Tests.Teardown();
        Console.WriteLine("{0} passed, {1} failed in {2} ms", passed, failed, total.ElapsedMilliseconds);
        return failed == 0 ? 0 : 1;
    }
}

internal sealed class AssertionException : Exception
{
    public AssertionException(string message) : base(message) { }
}

public static class Tests
{
    private const string ChatPrompt = "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n";
    private const int Max = 12;
    private static string _modelPath;
    private static Model _model;
    private static Cache _cache;

    internal static void Setup()
    {
        string dir = Environment.GetEnvironmentVariable("KILN_MODEL_DIR");
        if (string.IsNullOrEmpty(dir))
            dir = Path.Combine(Environment.GetFolderPath(Environment.SpecialFolder.UserProfile), ".cache", "kiln");
        _modelPath = Path.Combine(dir, "SmolLM2-135M-Instruct.Q4_1.gguf");
        if (!File.Exists(_modelPath)) throw new FileNotFoundException("run scripts/fetch_model.sh", _modelPath);
        _model = new Model(_modelPath);
        _cache = new Cache(_model, new CacheOptions { NCtx = 1024 });
    }

    internal static void Teardown()
    {
        _cache.Dispose();
        _model.Dispose();
    }

    private static void Check(bool condition, string what)
    {
        if (!condition) throw new AssertionException(what);
    }

    private static KilnException Throws(Status status, Action action)
    {
        try { action(); }
        catch (KilnException e)
        {
            Check(e.Status == status, "expected " + status + ", got " + e.Message);
            Check(e.Message.StartsWith("KILN_ERR_"), "message without the status name: " + e.Message);
            return e;
        }
        throw new AssertionException("expected a KilnException " + status);
    }

    private static Session ChatSession(SamplerOptions sampler = null)
    {
        Session s = _cache.CreateSession(sampler);
        s.Append(ChatPrompt, TokenizeFlags.ParseSpecial);
        return s;
    }

    public static void TestVersions()
    {
        Check(KilnLibrary.Version.Count(c => c == '.') == 2 && KilnLibrary.AbiVersion == 1, KilnLibrary.Version);
        Check(KilnLibrary.CpuInfo.Length > 0 && KilnLibrary.Backends.Length > 0, "cpu info");
    }

    public static void TestStructLayoutsMatchTheHeader()
    {
        // sizeof in C (LP64); a field added to kiln.h but not to Native.cs shows up here.
        var expected = new Dictionary<Type, int>
        {
            { typeof(Native.ModelParams), 56 }, { typeof(Native.ModelInfo), 88 },
            { typeof(Native.CacheParams), 72 }, { typeof(Native.CacheStats), 112 },
            { typeof(Native.SamplerParams), 72 }, { typeof(Native.GenerateParams), 40 },
            { typeof(Native.GenerateResult), 12 }, { typeof(Native.RequestParams), 96 },
            { typeof(Native.PollResult), 56 }, { typeof(Native.StepParams), 24 },
            { typeof(Native.StepResult), 32 }, { typeof(Native.StateParams), 12 },
            { typeof(Native.NgramParams), 40 }, { typeof(Native.DraftParams), 32 },
            { typeof(Native.MedusaParams), 16 }, { typeof(Native.EagleParams), 24 },
            { typeof(Native.SpecMetrics), 56 }, { typeof(Native.ChatMessage), 16 },
            { typeof(Native.TokenLogprob), 8 }, { typeof(Native.LogitBias), 8 },
        };
        foreach (var kv in expected)
            Check(Marshal.SizeOf(kv.Key) == kv.Value, kv.Key.Name + " is " + Marshal.SizeOf(kv.Key) + " bytes, not " + kv.Value);
        // offsetof of kiln_cache_params' fields added after the ABI 1 baseline, in header order.
        var offsets = new Dictionary<string, int>
        {
            { "LlamaCppOrder", 36 }, { "StepTokens", 40 }, { "Backend", 44 }, { "CudaDevice", 48 }, { "MlaPrefill", 52 },
            { "SlidingWindowSessions", 56 }, { "SwaFull", 60 }, { "PinThreads", 64 },
        };
        foreach (var kv in offsets)
        {
            int offset = (int)Marshal.OffsetOf(typeof(Native.CacheParams), kv.Key);
            Check(offset == kv.Value, "CacheParams." + kv.Key + " at " + offset + ", not " + kv.Value);
        }
        // And of kiln_cache_stats' fields added after it.
        var statsOffsets = new Dictionary<string, int>
        {
            { "KvBytesInUse", 80 }, { "SlidingBlocksTotal", 88 }, { "SlidingBlocksUsed", 92 },
            { "SlidingBlocksReleased", 96 }, { "SlidingBlockBytes", 104 },
        };
        foreach (var kv in statsOffsets)
        {
            int offset = (int)Marshal.OffsetOf(typeof(Native.CacheStats), kv.Key);
            Check(offset == kv.Value, "CacheStats." + kv.Key + " at " + offset + ", not " + kv.Value);
        }
        // And of kiln_eagle_params' and kiln_medusa_params' fields added after their first form.
        int mergeNgram = (int)Marshal.OffsetOf(typeof(Native.EagleParams), "MergeNgram");
        Check(mergeNgram == 20, "EagleParams.MergeNgram at " + mergeNgram + ", not 20");
        mergeNgram = (int)Marshal.OffsetOf(typeof(Native.MedusaParams), "MergeNgram");
        Check(mergeNgram == 12, "MedusaParams.MergeNgram at " + mergeNgram + ", not 12");
    }

    public static void TestLoadProgressAndCancel()
    {
        var seen = new List<float>();
        using (var m = new Model(_modelPath, p => { seen.Add(p); return true; }))
            Check(m.Info.NVocab > 0, "vocabulary");
        Check(seen.Count > 0 && seen.Last() == 1.0f, "progress " + string.Join(",", seen));
        for (int i = 1; i < seen.Count; i++) Check(seen[i] >= seen[i - 1], "progress goes back");
        Throws(Status.Cancelled, () => new Model(_modelPath, p => false));
        using (var cts = new CancellationTokenSource())
        {
            try
            {
                new Model(_modelPath, p => { cts.Cancel(); return true; }, cts.Token);
                throw new AssertionException("a cancelled load succeeded");
            }
            catch (KilnCancelledException e) { Check(e.Status == Status.Cancelled, "status"); }
        }
        try
        {
            new Model(_modelPath, p => { throw new InvalidOperationException("from progress"); });
            throw new AssertionException("the callback's exception was lost");
        }
        catch (InvalidOperationException e) { Check(e.Message == "from progress", e.Message); }
    }

    public static void TestLoadErrors()
    {
        string dir = Path.Combine(Path.GetTempPath(), "kiln-cs-" + Guid.NewGuid().ToString("N"));
        Directory.CreateDirectory(dir);
        try
        {
            var e = Throws(Status.IO, () => new Model(Path.Combine(dir, "missing.gguf")));
            Check(e.KilnMessage.Contains("missing.gguf"), e.KilnMessage);
            string bad = Path.Combine(dir, "bad.gguf");
            File.WriteAllBytes(bad, new byte[] { (byte)'G', (byte)'G', (byte)'U', (byte)'F' }.Concat(Enumerable.Repeat((byte)0xff, 60)).ToArray());
            e = Throws(Status.Format, () => new Model(bad));
            Check(e.KilnMessage.Length > 0, "no message");
        }
        finally { Directory.Delete(dir, true); }
    }

    public static void TestInfoAndMetadata()
    {
        ModelInfo info = _model.Info;
        Check(info.Architecture == "llama" && info.NVocab == 49152 && info.NLayer == 30, info.Architecture);
        Check(_model.Meta("general.architecture") == "\"llama\"", "meta");
        Check(_model.Meta("no.such.key") == null, "missing key");
        Check(_model.IsEndOfGeneration(info.TokenEos), "eos");
    }

    public static void TestTokenizeRoundTrip()
    {
        const string text = "Hello, world! Ünïcödé 🙂";
        int[] tokens = _model.Tokenize(text);
        Check(tokens.Length > 3 && _model.Detokenize(tokens) == text, "round trip");
        int[] special = _model.Tokenize("<|im_start|>user", TokenizeFlags.ParseSpecial);
        Check(special.Length < _model.Tokenize("<|im_start|>user").Length, "special");
        Check(_model.Detokenize(special, renderSpecial: true) == "<|im_start|>user", "render special");
        Check(_model.Tokenize("").Length == 0, "empty");
        var e = Throws(Status.InvalidArgument, () => _model.Detokenize(new[] { 1, 2, 1000000 }));
        Check(e.KilnMessage.Contains("2"), "index not named: " + e.KilnMessage);
    }

    public static void TestChatTemplate()
    {
        var msgs = new List<KeyValuePair<string, string>>
        {
            new KeyValuePair<string, string>("system", "Be brief."), new KeyValuePair<string, string>("user", "Hi"),
        };
        string own = _model.ApplyChatTemplate(msgs);
        Check(own.Contains("<|im_start|>user\nHi<|im_end|>") && own.EndsWith("<|im_start|>assistant\n"), own);
        string chatml = _model.ApplyChatTemplate(msgs, "chatml", false);
        Check(chatml.Contains("<|im_start|>system\nBe brief.<|im_end|>") && !chatml.EndsWith("assistant\n"), chatml);
        Throws(Status.InvalidArgument, () => _model.ApplyChatTemplate(new[] { new KeyValuePair<string, string>("wizard", "x") }));
    }

    public static void TestCacheAndSession()
    {
        int before = _cache.Stats.NSequences;
        Session s = ChatSession();
        Check(_cache.Stats.NSequences == before + 1, "sequences");
        int[] prompt = _model.Tokenize(ChatPrompt, TokenizeFlags.ParseSpecial);
        Check(s.Tokens.SequenceEqual(prompt) && s.NTokens == prompt.Length, "tokens");
        float[] logits = s.Logits;
        Check(logits.Length == 49152 && !float.IsNaN(logits[0]), "logits");
        s.Dispose();
        Check(_cache.Stats.NSequences == before, "sequences after dispose");
        try { s.Append("x"); throw new AssertionException("a disposed session took a call"); }
        catch (ObjectDisposedException) { }
    }

    public static void TestGenerateAndStreamAgree()
    {
        GenerateResult result;
        var streamed = new System.Text.StringBuilder();
        using (Session a = ChatSession())
            result = a.Generate(Max, new GenerateOptions { OnToken = (t, piece) => { streamed.Append(piece); return true; } });
        Check(result.Tokens.Length == Max && result.StopReason == StopReason.MaxTokens && result.Text.Length > 0, "generate");
        Check(streamed.ToString() == result.Text, "callback text " + streamed + " vs " + result.Text);
        using (Session b = _cache.CreateSession())
        {
            PollResult last = null;
            var pieces = b.Stream(new Request { Text = ChatPrompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = Max },
                                  result: r => last = r).ToList();
            Check(pieces.Count > 1 && string.Concat(pieces) == result.Text, "stream " + string.Concat(pieces));
            Check(last != null && last.Done && last.Error == null && last.StopReason == StopReason.MaxTokens, "final poll");
            Check(b.Tokens.Skip(b.NTokens - Max).SequenceEqual(result.Tokens), "stream tokens");
        }
        using (Session c = ChatSession())
        {
            var task = c.GenerateAsync(Max);
            Check(task.Wait(60000) && task.Result.Tokens.SequenceEqual(result.Tokens), "GenerateAsync");
        }
    }

    public static void TestStreamLeftEarlyCancels()
    {
        using (Session s = _cache.CreateSession())
        {
            foreach (string piece in s.Stream(new Request { Text = ChatPrompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = 64 }))
                break;
            int n = s.NTokens;
            s.Append(" ok"); // the request ended: the session takes calls again
            Check(s.NTokens > n && n < _model.Tokenize(ChatPrompt, TokenizeFlags.ParseSpecial).Length + 64, "tokens " + n);
        }
    }

    public static void TestStopStringAndCallbackStop()
    {
        using (Session s = ChatSession())
        {
            string text;
            using (Session full = s.Fork()) text = full.Generate(Max).Text;
            string word = text.Split((char[])null, StringSplitOptions.RemoveEmptyEntries)[1];
            GenerateResult r = s.Generate(Max, new GenerateOptions { Stop = new[] { word } });
            Check(r.StopReason == StopReason.StopString && !r.Text.Contains(word), "stop " + word + ": " + r.Text);
            r = s.Generate(Max, new GenerateOptions { OnToken = (t, p) => false });
            Check(r.StopReason == StopReason.Callback && r.Tokens.Length == 1, "callback stop");
            try
            {
                s.Generate(Max, new GenerateOptions { OnToken = (t, p) => { throw new InvalidOperationException("boom"); } });
                throw new AssertionException("the callback's exception was lost");
            }
            catch (InvalidOperationException) { }
        }
    }

    public static void TestCancellationTokenFromAnotherThread()
    {
        using (Session s = ChatSession())
        using (var cts = new CancellationTokenSource())
        using (var firstToken = new ManualResetEventSlim())
        using (var cancelReturned = new ManualResetEventSlim())
        {
            var canceller = new Thread(() => { firstToken.Wait(30000); cts.Cancel(); cancelReturned.Set(); });
            canceller.Start();
            int n = 0;
            GenerateResult r = s.Generate(64, new GenerateOptions
            {
                OnToken = (t, p) =>
                {
                    // The next step comes after the cancel (and its registered kiln cancel).
                    if (++n == 1) { firstToken.Set(); cancelReturned.Wait(30000); }
                    return true;
                },
            }, cts.Token);
            canceller.Join();
            // Cancel() runs the token's registration (kiln's cancel) before it returns: one token.
            Check(r.StopReason == StopReason.Cancelled && r.Tokens.Length == 1, r.StopReason + " after " + r.Tokens.Length);

            // Session.Cancel from another thread, without a token.
            using (var first = new ManualResetEventSlim())
            using (var cancelled = new ManualResetEventSlim())
            {
                var other = new Thread(() => { first.Wait(30000); s.Cancel(); cancelled.Set(); });
                other.Start();
                n = 0;
                r = s.Generate(64, new GenerateOptions
                {
                    OnToken = (t, p) => { if (++n == 1) { first.Set(); cancelled.Wait(30000); } return true; },
                });
                other.Join();
                Check(r.StopReason == StopReason.Cancelled && r.Tokens.Length == 1, "Cancel: " + r.StopReason + " after " + r.Tokens.Length);
            }
            // With the token already cancelled: an append throws KilnCancelledException, a generate
            // returns Cancelled; neither changes the session.
            int before = s.NTokens;
            try { s.Append("more", TokenizeFlags.None, cts.Token); throw new AssertionException("append ran"); }
            catch (KilnCancelledException) { }
            Check(s.Generate(4, null, cts.Token).StopReason == StopReason.Cancelled && s.NTokens == before, "changed");
        }
    }

    public static void TestForkAndRewind()
    {
        using (Session s = ChatSession())
        {
            int[] prompt = s.Tokens;
            GenerateResult a, b;
            using (Session f = s.Fork())
            {
                a = s.Generate(Max);
                Check(f.NTokens == prompt.Length, "the fork changed");
                b = f.Generate(Max);
            }
            Check(a.Tokens.SequenceEqual(b.Tokens), "fork differs");
            s.Rewind(Max);
            Check(s.Tokens.SequenceEqual(prompt), "rewind");
            Check(s.Generate(Max).Tokens.SequenceEqual(a.Tokens), "regenerate");
            Throws(Status.OutOfRange, () => s.Rewind(1000000));
        }
    }

    public static void TestLogprobs()
    {
        using (Session s = ChatSession(new SamplerOptions { NLogprobs = 5 }))
        {
            float[] logits = s.Logits;
            int argmax = Array.IndexOf(logits, logits.Max());
            GenerateResult r = s.Generate(1);
            TokenLogprob[] top = s.Logprobs();
            Check(top.Length == 5 && top[0].Token == r.Tokens[0] && top[0].Token == argmax, "top");
            for (int i = 1; i < top.Length; i++) Check(top[i].Logprob <= top[i - 1].Logprob && top[i].Logprob <= 0, "order");
        }
    }

    public static void TestNgramStrategyIsLosslessWithMetrics()
    {
        string text = string.Concat(Enumerable.Repeat("one two three four five six seven eight. ", 4)) + "one two three";
        int[] expected;
        using (Session plain = _cache.CreateSession())
        {
            plain.Append(text);
            expected = plain.Generate(Max).Tokens;
        }
        using (Strategy st = Strategy.Ngram(maxDraft: 4))
        using (Session s = _cache.CreateSession())
        {
            s.Append(text);
            s.SetStrategy(st);
            Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless");
            SpecMetrics m = s.SpecMetrics;
            Check(m.Steps > 0 && m.Drafted > 0 && m.Accepted <= m.Drafted && m.TargetPassesPerToken <= 1, "metrics");
            s.SetStrategy(null);
        }
        var e = Throws(Status.InvalidArgument, () => Strategy.Ngram(maxDraft: -1));
        Check(e.KilnMessage.Contains("max_draft"), e.KilnMessage);
    }

    public static void TestDraftStrategy()
    {
        // The model drafting for itself: a draft model needs only the target's vocabulary size.
        int[] expected;
        using (Session plain = ChatSession()) expected = plain.Generate(Max).Tokens;
        using (Strategy draft = Strategy.Draft(_model, _modelPath, maxDraft: 3, nThreads: 1))
        using (Session s = ChatSession())
        {
            s.SetStrategy(draft);
            Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless");
            SpecMetrics m = s.SpecMetrics;
            Check(m.Drafted > 0 && m.Accepted > 0 && m.Accepted <= m.Drafted, "metrics");
            Throws(Status.Unsupported, () => s.SaveState()); // a draft model cannot save its state
            s.SetStrategy(null);
        }
        Throws(Status.IO, () => Strategy.Draft(_model, Path.Combine(Path.GetTempPath(), "kiln-missing-draft.gguf")));
    }

    // The repository's models/, found from this file's path at compile time (the runner runs from
    // the build directory).
    private static string ModelsDir([CallerFilePath] string source = "")
    {
        return Path.Combine(Path.GetDirectoryName(source), "..", "..", "..", "models");
    }

    public static void TestMedusaStrategy()
    {
        // The repository's trained head for the default model: greedy output is plain decoding's.
        string head = Path.Combine(ModelsDir(), "SmolLM2-135M-Instruct.medusa.gguf");
        int[] expected;
        using (Session plain = ChatSession()) expected = plain.Generate(Max).Tokens;
        using (Strategy medusa = Strategy.Medusa(_model, head, nThreads: 1))
        using (Session s = ChatSession())
        {
            s.SetStrategy(medusa);
            Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless");
            SpecMetrics m = s.SpecMetrics;
            Check(m.Steps > 0 && m.Drafted > 0 && m.Accepted <= m.Drafted, "metrics");
            Check(Math.Abs(m.MeanAcceptedPerStep - (double)m.Accepted / m.Steps) < 1e-9, "mean accepted per step");
            Check(m.TargetPassesPerToken > 0 && m.TargetPassesPerToken <= 1, "passes per token");
            s.SetStrategy(null);
        }
        // Without the n-gram candidates merged in: the heads' tree alone, still exact.
        using (Strategy alone = Strategy.Medusa(_model, head, nThreads: 1, mergeNgram: false))
        using (Session s = ChatSession())
        {
            s.SetStrategy(alone);
            Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless without the n-gram merge");
            s.SetStrategy(null);
        }
        // A model is not a head trained for it; a missing file names itself.
        var e = Throws(Status.InvalidArgument, () => Strategy.Medusa(_model, _modelPath));
        Check(e.KilnMessage.Contains("not a medusa head"), e.KilnMessage);
        string missing = Path.Combine(Path.GetTempPath(), "kiln-missing.medusa.gguf");
        e = Throws(Status.IO, () => Strategy.Medusa(_model, missing));
        Check(e.KilnMessage.Contains(missing), e.KilnMessage);
        e = Throws(Status.InvalidArgument, () => Strategy.Medusa(_model, head, maxDraft: -1));
        Check(e.KilnMessage.Contains("max_draft"), e.KilnMessage);
    }

    public static void TestSubmitPollStepMatchesBlocking()
    {
        GenerateResult expected;
        using (Session r = ChatSession()) expected = r.Generate(Max);
        using (Session s = _cache.CreateSession())
        {
            s.Submit(new Request { Text = ChatPrompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = Max });
            Throws(Status.Busy, () => s.Append("busy"));
            var text = new List<byte>();
            var tokens = new List<int>();
            int steps = 0;
            PollResult polled;
            while (true)
            {
                polled = s.Poll();
                text.AddRange(polled.Text);
                tokens.AddRange(polled.Tokens);
                if (polled.Done) break;
                steps += _cache.Step(5).NSteps;
            }
            Check(polled.Error == null && polled.StopReason == StopReason.MaxTokens && steps >= Max, "done");
            Check(tokens.SequenceEqual(expected.Tokens) && System.Text.Encoding.UTF8.GetString(text.ToArray()) == expected.Text, "output");
            s.Append(" more");
        }
    }

    public static void TestWorkerAndRequestErrors()
    {
        using (Session s = _cache.CreateSession())
        {
            Throws(Status.InvalidArgument, () => s.Submit(new Request { MaxTokens = 4 }));
            Throws(Status.InvalidArgument, () => s.Poll());
            s.Submit(new Request { Text = ChatPrompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = Max });
            s.Cancel(); // queued: fails with Cancelled and keeps nothing
            PollResult r;
            while (!(r = s.Poll()).Done) _cache.Step();
            Check(r.Error != null && r.Error.Status == Status.Cancelled && s.NTokens == 0, "queued cancel");
            _cache.StartWorker();
            try
            {
                var pieces = s.Stream(new Request { Text = ChatPrompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = Max }).ToList();
                Check(pieces.Count > 0 && s.NTokens == _model.Tokenize(ChatPrompt, TokenizeFlags.ParseSpecial).Length + Max, "worker");
            }
            finally { _cache.StopWorker(); }
        }
    }

    public static void TestSavedStateContinues()
    {
        using (Session s = ChatSession())
        {
            s.Generate(4);
            byte[] state = s.SaveState();
            int[] expected = s.Generate(Max).Tokens;
            using (Session r = _cache.CreateSession())
            {
                Throws(Status.Format, () => r.LoadState(state.Take(state.Length / 2).ToArray()));
                Check(r.NTokens == 0, "a failed load changed the session");
                r.LoadState(state);
                Check(r.Generate(Max).Tokens.SequenceEqual(expected), "restored");
            }
        }
    }

    public static void TestBadArguments()
    {
        var e = Throws(Status.InvalidArgument, () => new Cache(_model, new CacheOptions { BlockSize = -1 }));
        Check(e.KilnMessage.Contains("block_size"), e.KilnMessage);
        Throws(Status.InvalidArgument, () => _cache.CreateSession(new SamplerOptions { RepeatPenalty = -1 }));
        using (Session s = _cache.CreateSession())
        {
            Throws(Status.InvalidArgument, () => s.Generate(4));
            Throws(Status.InvalidArgument, () => s.AppendTokens(new[] { 10000000 }));
        }
    }

    public static void TestDisposeOutOfOrderIsSafe()
    {
        // The model is disposed first, but its cache and session hold references to it: the
        // native model is freed only after them.
        var m = new Model(_modelPath);
        var c = new Cache(m, new CacheOptions { NCtx = 256 });
        Session s = c.CreateSession();
        s.Append("hi");
        m.Dispose();
        c.Dispose();
        s.Append(" there"); // still valid
        Check(s.NTokens > 1, "session");
        s.Dispose();
    }

    // Files scripts/test_bindings.sh writes into $KILN_BINDINGS_FIXTURES with kiln-mkmodel and
    // kiln-mkeagle: a tiny deepseek2 model and an EAGLE head for the default model.
    private static string Fixture(string name)
    {
        string dir = Environment.GetEnvironmentVariable("KILN_BINDINGS_FIXTURES");
        if (string.IsNullOrEmpty(dir))
            throw new AssertionException("KILN_BINDINGS_FIXTURES is not set: run scripts/test_bindings.sh, which writes the fixtures");
        string path = Path.Combine(dir, name);
        if (!File.Exists(path)) throw new FileNotFoundException("run scripts/test_bindings.sh", path);
        return path;
    }

    private static string MetaValue(IList<KeyValuePair<string, string>> entries, string key)
    {
        return entries.Where(e => e.Key == key).Select(e => e.Value).FirstOrDefault();
    }

    public static void TestCacheBackendCpuAndCudaFallback()
    {
        Check(_cache.Backend.StartsWith("cpu") && !_cache.Backend.Contains("requested"), _cache.Backend);
        using (var pinned = new Cache(_model, new CacheOptions { NCtx = 256, NThreads = 2, PinThreads = true }))
            Check(pinned.Backend.Contains("workers pinned"), pinned.Backend);
        using (var c = new Cache(_model, new CacheOptions { NCtx = 256, Backend = Backend.Cuda, CudaDevice = 0 }))
        {
            string chosen = c.Backend;
            if (chosen.StartsWith("cpu"))
            {
                // No CUDA module, driver or device here: the cache still runs, on the CPU, and says why.
                const string prefix = "; cuda requested, running on the CPU: ";
                int i = chosen.IndexOf(prefix, StringComparison.Ordinal);
                Check(i >= 0 && chosen.Substring(i + prefix.Length).Trim().Length > 0, "fallback without a reason: " + chosen);
            }
            else
            {
                Check(chosen.StartsWith("cuda"), chosen);
            }
            using (Session s = c.CreateSession())
            {
                s.Append("Hello");
                Check(s.Generate(2).Tokens.Length == 2, "generate on the chosen backend");
            }
        }
        var e = Throws(Status.InvalidArgument, () => new Cache(_model, new CacheOptions { NCtx = 256, Backend = (Backend)7 }));
        Check(e.KilnMessage.Contains("backend"), e.KilnMessage);
    }

    public static void TestCacheStepTokens()
    {
        int[] prompt = _model.Tokenize(string.Concat(Enumerable.Repeat("The quick brown fox jumps over the lazy dog. ", 12)));
        Check(prompt.Length > 100, "prompt of " + prompt.Length + " tokens");
        // One step computes the whole prompt (under the 256-token chunk) by default, 48 tokens with
        // StepTokens 48. New caches: no prefix cache hit.
        foreach (var tc in new[] { new { StepTokens = 0, Expected = (long)prompt.Length }, new { StepTokens = 48, Expected = 48L } })
        {
            using (var c = new Cache(_model, new CacheOptions { NCtx = 256, StepTokens = tc.StepTokens }))
            using (Session s = c.CreateSession())
            {
                s.Submit(new Request { Tokens = prompt, MaxTokens = 0 });
                long first = c.Step().NTokens;
                Check(first == tc.Expected, "StepTokens " + tc.StepTokens + ": first step " + first + " tokens");
                while (!s.Poll().Done) c.Step();
                Check(s.NTokens == prompt.Length, "prompt computed");
            }
        }
        var e = Throws(Status.InvalidArgument, () => new Cache(_model, new CacheOptions { NCtx = 256, StepTokens = -1 }));
        Check(e.KilnMessage.Contains("step_tokens"), e.KilnMessage);
    }

    public static void TestMlaPrefillOnDeepseek2()
    {
        using (var m = new Model(Fixture("tiny-deepseek2.gguf")))
        {
            Check(m.Info.Architecture == "deepseek2", m.Info.Architecture);
            // A prompt of more than 128 tokens in one chunk: measured runs it decompressed, whose
            // logits agree with the absorbed form's to float rounding but not bit for bit.
            int[] prompt = m.Tokenize(string.Concat(Enumerable.Repeat("the quick brown fox jumps ", 30)));
            Check(prompt.Length > 128, "prompt of " + prompt.Length + " tokens");
            Func<MlaPrefill, float[]> logits = mode =>
            {
                using (var c = new Cache(m, new CacheOptions { NThreads = 2, MlaPrefill = mode }))
                using (Session s = c.CreateSession())
                {
                    s.AppendTokens(prompt);
                    return s.Logits;
                }
            };
            float[] absorbed = logits(MlaPrefill.Absorbed), measured = logits(MlaPrefill.Measured);
            double scale = absorbed.Max(x => Math.Abs(x));
            double diff = absorbed.Zip(measured, (a, b) => Math.Abs(a - b)).Max();
            Check(diff > 0, "measured ran the absorbed form (bitwise equal logits)");
            Check(diff <= 1e-3 * scale, "max difference " + diff + ", scale " + scale);
            var e = Throws(Status.InvalidArgument, () => new Cache(m, new CacheOptions { MlaPrefill = (MlaPrefill)7 }));
            Check(e.KilnMessage.Contains("mla_prefill 7"), e.KilnMessage);
        }
    }

    public static void TestEagleStrategy()
    {
        // An untrained head from kiln-mkeagle: greedy output is still plain decoding's (exact
        // verification), and it drafts.
        string head = Fixture("SmolLM2-135M-Instruct.eagle.gguf");
        int[] expected;
        using (Session plain = ChatSession()) expected = plain.Generate(Max).Tokens;
        using (Strategy eagle = Strategy.Eagle(_model, head, topK: 4, maxDepth: 3, nThreads: 1))
        using (Session s = ChatSession())
        {
            s.SetStrategy(eagle);
            Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless");
            SpecMetrics m = s.SpecMetrics;
            Check(m.Steps > 0 && m.Drafted > 0 && m.Accepted <= m.Drafted, "metrics");
            s.SetStrategy(null);
        }
        // Without the n-gram candidates merged in: the head's tree alone, still exact.
        using (Strategy alone = Strategy.Eagle(_model, head, topK: 4, maxDepth: 3, nThreads: 1, mergeNgram: false))
        using (Session s = ChatSession())
        {
            s.SetStrategy(alone);
            Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless without the n-gram merge");
            s.SetStrategy(null);
        }
        var e = Throws(Status.InvalidArgument, () => Strategy.Eagle(_model, head, maxDepth: 17));
        Check(e.KilnMessage.Contains("max_depth"), e.KilnMessage);
        Throws(Status.InvalidArgument, () => Strategy.Eagle(_model, _modelPath)); // a model, not a head
    }

    public static void TestGgufInspectionAndMetadata()
    {
        using (var g = new GgufFile(_modelPath))
        {
            Check(MetaValue(g.Metadata, "general.architecture") == "\"llama\"", "architecture");
            Check(g.Unsupported.Length == 0, string.Join("; ", g.Unsupported));
            Check(_model.Metadata.Count == g.Metadata.Count && MetaValue(_model.Metadata, "general.architecture") == "\"llama\"",
                  "model metadata");
        }
        // An eagle head is a valid GGUF that kiln cannot run as a model: the problems are listed.
        using (var g = new GgufFile(Fixture("SmolLM2-135M-Instruct.eagle.gguf")))
        {
            Check(MetaValue(g.Metadata, "general.architecture") == "\"eagle\"", "eagle architecture");
            Check(g.Unsupported.Length > 0 && g.Unsupported[0].Contains("eagle"), string.Join("; ", g.Unsupported));
        }
        Throws(Status.IO, () => new GgufFile(Path.Combine(Path.GetTempPath(), "kiln-missing.gguf")));
        string bad = Path.GetTempFileName();
        try
        {
            File.WriteAllBytes(bad, System.Text.Encoding.ASCII.GetBytes("GGUF").Concat(new byte[60]).ToArray());
            Throws(Status.Format, () => new GgufFile(bad));
        }
        finally { File.Delete(bad); }
    }

    public static void TestScoreAndStateFiles()
    {
        int[] tokens = _model.Tokenize("The capital of France is Paris.");
        string path = Path.GetTempFileName();
        try
        {
            using (Session s = _cache.CreateSession())
            {
                float[] scores = s.Score(tokens);
                Check(scores.Length == tokens.Length - 1 && s.NTokens == tokens.Length, "scored tokens");
                Check(scores.All(x => x <= 0 && !float.IsNaN(x)), "log-probabilities");
                Check(s.SaveState(kv: false).Length < s.SaveState().Length, "a tokens-only state is smaller");
                s.SaveStateFile(path, kv: false);
                int[] expected = s.Generate(4).Tokens;
                using (Session r = _cache.CreateSession())
                {
                    r.LoadStateFile(path);
                    Check(r.Generate(4).Tokens.SequenceEqual(expected), "restored from the file");
                    Throws(Status.IO, () => r.LoadStateFile(path + ".missing"));
                }
            }
        }
        finally { File.Delete(path); }
    }

    public static void TestSamplerPenaltiesAndLogitBias()
    {
        int first;
        using (Session plain = ChatSession()) first = plain.Generate(1).Tokens[0];
        // Banning the greedy choice makes greedy decoding pick another token.
        var ban = new SamplerOptions { LogitBias = new Dictionary<int, float> { { first, float.NegativeInfinity } } };
        using (Session s = ChatSession(ban)) Check(s.Generate(1).Tokens[0] != first, "the banned token was generated");
        var penalties = new SamplerOptions { TypicalP = 0.9f, FrequencyPenalty = 0.5f, PresencePenalty = 0.5f, PenaltyLastN = -1 };
        using (Session s = ChatSession(penalties)) Check(s.Generate(4).Tokens.Length == 4, "generate with penalties");
        var e = Throws(Status.InvalidArgument, () => _cache.CreateSession(new SamplerOptions { PenaltyLastN = -2 }));
        Check(e.KilnMessage.Contains("penalty_last_n"), e.KilnMessage);
    }

    public static void TestLoadLogsItsLines()
    {
        var lines = new List<KeyValuePair<LogLevel, string>>();
        Action<LogLevel, string> log = (level, line) => lines.Add(new KeyValuePair<LogLevel, string>(level, line));
        using (new Model(_modelPath, log: log)) { }
        Check(lines.Any(l => l.Key == LogLevel.Info && l.Value.Length > 0), "no info line");
        // A failed load logs its error, the message the exception carries.
        lines.Clear();
        var e = Throws(Status.IO, () => new Model(Path.Combine(Path.GetTempPath(), "kiln-missing.gguf"), log: log));
        Check(lines.Contains(new KeyValuePair<LogLevel, string>(LogLevel.Error, e.KilnMessage)), "error not logged: " + e.KilnMessage);
        try
        {
            new Model(_modelPath, log: (level, line) => { throw new InvalidOperationException("from log"); }).Dispose();
            throw new AssertionException("the exception in log was not rethrown");
        }
        catch (InvalidOperationException x) { Check(x.Message == "from log", x.Message); }
    }

    public static void TestNgramAndDraftOptions()
    {
        string text = string.Concat(Enumerable.Repeat("one two three four five six seven eight. ", 4)) + "one two three";
        int[] expected;
        using (Session plain = _cache.CreateSession())
        {
            plain.Append(text);
            expected = plain.Generate(Max).Tokens;
        }
        var strategies = new Func<Strategy>[]
        {
            () => Strategy.Ngram(maxDraft: 4, maxSkip: 0, adaptive: false, fixedPassCostBeta: 0),
            () => Strategy.Draft(_model, _modelPath, maxDraft: 3, nThreads: 1, nCtx: 256, adaptive: false, fixedPassCostBeta: 0),
        };
        foreach (var create in strategies)
        {
            using (Strategy st = create())
            using (Session s = _cache.CreateSession())
            {
                s.Append(text);
                s.SetStrategy(st);
                Check(s.Generate(Max).Tokens.SequenceEqual(expected), "lossless");
                SpecMetrics m = s.SpecMetrics;
                Check(m.Drafted > 0 && m.Accepted <= m.Drafted, "metrics");
                s.SetStrategy(null);
            }
        }
        var e = Throws(Status.InvalidArgument, () => Strategy.Ngram(maxSkip: -1));
        Check(e.KilnMessage.Contains("max_skip"), e.KilnMessage);
        e = Throws(Status.InvalidArgument, () => Strategy.Draft(_model, _modelPath, nCtx: -1));
        Check(e.KilnMessage.Contains("n_ctx"), e.KilnMessage);
    }

    public static void TestRequestCallbacksOnTheWorker()
    {
        GenerateResult expected;
        using (Session r = ChatSession()) expected = r.Generate(Max);
        using (Session s = _cache.CreateSession())
        {
            var pieces = new List<string>();
            var done = new ManualResetEvent(false);
            KilnException error = null;
            StopReason reason = StopReason.EndOfGeneration;
            int n = -1;
            _cache.StartWorker();
            try
            {
                s.Submit(new Request
                {
                    Text = ChatPrompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = Max,
                    OnToken = (token, piece) => { pieces.Add(piece); return true; },
                    OnDone = (e, why, count) => { error = e; reason = why; n = count; done.Set(); },
                });
                Check(done.WaitOne(60000), "on_done was not called");
            }
            finally { _cache.StopWorker(); }
            Check(error == null && reason == StopReason.MaxTokens && n == Max, "done: " + reason + " " + n);
            Check(string.Concat(pieces) == expected.Text, "pieces '" + string.Concat(pieces) + "'");
            Check(s.Poll().Done, "poll after on_done");
            // An exception in a callback ends the request and comes back from Poll.
            s.Submit(new Request { Text = " more", MaxTokens = 4, OnToken = (t, p) => { throw new InvalidOperationException("from on_token"); } });
            PollResult polled = null;
            try
            {
                while (true)
                {
                    polled = s.Poll();
                    if (polled.Done) break;
                    _cache.Step();
                }
                throw new AssertionException("the exception in on_token was not rethrown");
            }
            catch (InvalidOperationException x) { Check(x.Message == "from on_token", x.Message); }
            while (!(polled = s.Poll()).Done) _cache.Step();
            Check(polled.Error == null && polled.StopReason == StopReason.Callback, "ended by the callback");
        }
    }
}
