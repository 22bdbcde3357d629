// chat streams a greedy answer to one question from a GGUF chat model; Ctrl-C stops it.
//
//	go run ./examples/chat [-model PATH] [-n TOKENS] "question"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"

	kiln "github.com/kiln/kiln/bindings/go"
)

func main() {
	home, _ := os.UserHomeDir()
	modelPath := flag.String("model", filepath.Join(home, ".cache", "kiln", "SmolLM2-135M-Instruct.Q4_1.gguf"), "GGUF model")
	maxTokens := flag.Int("n", 64, "most tokens to generate")
	flag.Parse()
	question := "What is the capital of France?"
	if flag.NArg() > 0 {
		question = flag.Arg(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *modelPath, question, *maxTokens); err != nil {
		fmt.Fprintln(os.Stderr, "chat:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, modelPath, question string, maxTokens int) error {
	model, err := kiln.LoadModel(ctx, modelPath, nil)
	if err != nil {
		return err
	}
	defer model.Close()
	cache, err := model.NewCache(&kiln.CacheOptions{NCtx: 2048})
	if err != nil {
		return err
	}
	defer cache.Close()
	session, err := cache.NewSession(nil) // greedy
	if err != nil {
		return err
	}
	defer session.Close()

	prompt, err := model.ApplyChatTemplate([]kiln.ChatMessage{{Role: "user", Content: question}}, "", true)
	if err != nil {
		return err
	}
	if err := session.Append(ctx, prompt, kiln.TokenizeOptions{ParseSpecial: true}); err != nil {
		return err
	}
	pieces, end := session.Stream(ctx, maxTokens, []string{"<|im_end|>"})
	for piece := range pieces {
		fmt.Print(piece)
	}
	result := <-end
	fmt.Printf("\n[%d tokens, %v]\n", len(result.Result.Tokens), result.Result.StopReason)
	if errors.Is(result.Err, context.Canceled) {
		return nil // Ctrl-C: what was generated is printed
	}
	return result.Err
}
