// Chat streams a greedy answer to one question from a GGUF chat model; Ctrl-C stops it.
//   mono Chat.exe [question] [model.gguf]
using System;
using System.Collections.Generic;
using System.IO;
using System.Threading;
using Kiln;

internal static class Chat
{
    private static int Main(string[] args)
    {
        string question = args.Length > 0 ? args[0] : "What is the capital of France?";
        string modelPath = args.Length > 1 ? args[1] : Path.Combine(
            Environment.GetFolderPath(Environment.SpecialFolder.UserProfile), ".cache", "kiln",
            "SmolLM2-135M-Instruct.Q4_1.gguf");
        using (var stop = new CancellationTokenSource())
        {
            Console.CancelKeyPress += (sender, e) => { e.Cancel = true; stop.Cancel(); };
            try
            {
                using (var model = new Model(modelPath, cancellation: stop.Token))
                using (var cache = new Cache(model, new CacheOptions { NCtx = 2048 }))
                using (Session session = cache.CreateSession()) // greedy
                {
                    string prompt = model.ApplyChatTemplate(new[] { new KeyValuePair<string, string>("user", question) });
                    PollResult end = null;
                    var request = new Request { Text = prompt, Flags = TokenizeFlags.ParseSpecial, MaxTokens = 64, Stop = new[] { "<|im_end|>" } };
                    foreach (string piece in session.Stream(request, stop.Token, r => end = r))
                        Console.Write(piece);
                    Console.WriteLine();
                    Console.WriteLine("[{0} tokens, {1}]", end.NTokens, end.StopReason);
                }
                return 0;
            }
            catch (KilnException e)
            {
                Console.Error.WriteLine("chat: " + e.Message);
                return 1;
            }
        }
    }
}
