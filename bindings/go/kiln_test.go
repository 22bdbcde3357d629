package kiln

// The Go binding on the default model (SmolLM2-135M-Instruct Q4_1 in $KILN_MODEL_DIR or
// ~/.cache/kiln, fetched by scripts/fetch_model.sh): greedy, about a dozen tokens per generate.

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	chatPrompt = "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n"
	maxTokens  = 12
)

var (
	modelPath string
	model     *Model
	cache     *Cache
)

func TestMain(m *testing.M) {
	dir := os.Getenv("KILN_MODEL_DIR")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "kiln")
	}
	modelPath = filepath.Join(dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
	var err error
	if model, err = LoadModel(context.Background(), modelPath, nil); err != nil {
		println("default model: run scripts/fetch_model.sh:", err.Error())
		os.Exit(1)
	}
	if cache, err = model.NewCache(&CacheOptions{NCtx: 1024}); err != nil {
		println(err.Error())
		os.Exit(1)
	}
	code := m.Run()
	cache.Close()
	model.Close()
	os.Exit(code)
}

func chatSession(t *testing.T, sampler *SamplerOptions) *Session {
	t.Helper()
	s, err := cache.NewSession(sampler)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Append(context.Background(), chatPrompt, TokenizeOptions{ParseSpecial: true}); err != nil {
		t.Fatal(err)
	}
	return s
}

func wantStatus(t *testing.T, err error, sentinel *Error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, sentinel) {
		t.Fatalf("want %v, got %v", sentinel.Status, err)
	}
	if e.Message == "" {
		t.Fatalf("%v without a message", e.Status)
	}
	return e
}

func TestVersions(t *testing.T) {
	if strings.Count(Version(), ".") != 2 || ABIVersion() != 1 || CPUInfo() == "" || Backends() == "" {
		t.Fatalf("version %q abi %d cpu %q", Version(), ABIVersion(), CPUInfo())
	}
}

func TestLoadProgressAndCancel(t *testing.T) {
	var seen []float32
	m, err := LoadModel(context.Background(), modelPath, &LoadOptions{Progress: func(p float32) bool {
		seen = append(seen, p)
		return true
	}})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Close() // twice is a no-op
	if len(seen) == 0 || seen[len(seen)-1] != 1 {
		t.Fatalf("progress %v", seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] {
			t.Fatalf("progress not monotonic: %v", seen)
		}
	}
	_, err = LoadModel(context.Background(), modelPath, &LoadOptions{Progress: func(float32) bool { return false }})
	wantStatus(t, err, ErrCancelled)

	// A context cancelled during the load stops it at the next progress report.
	ctx, cancel := context.WithCancel(context.Background())
	_, err = LoadModel(ctx, modelPath, &LoadOptions{Progress: func(float32) bool { cancel(); return true }})
	wantStatus(t, err, ErrCancelled)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v does not match context.Canceled", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadModel(context.Background(), filepath.Join(dir, "missing.gguf"), nil)
	if e := wantStatus(t, err, ErrIO); !strings.Contains(e.Message, "missing.gguf") {
		t.Fatalf("message %q does not name the file", e.Message)
	}
	bad := filepath.Join(dir, "bad.gguf")
	os.WriteFile(bad, append([]byte("GGUF"), bytes.Repeat([]byte{0xff}, 60)...), 0o600)
	_, err = LoadModel(context.Background(), bad, nil)
	wantStatus(t, err, ErrFormat)
	if !strings.HasPrefix(err.Error(), "KILN_ERR_FORMAT: ") || errors.Is(err, ErrIO) {
		t.Fatalf("error %q", err)
	}
}

func TestInfoAndMetadata(t *testing.T) {
	info, err := model.Info()
	if err != nil || info.Architecture != "llama" || info.NVocab != 49152 || info.NLayer != 30 {
		t.Fatalf("%+v %v", info, err)
	}
	if v, ok := model.Meta("general.architecture"); !ok || v != `"llama"` {
		t.Fatalf("meta %q %v", v, ok)
	}
	if _, ok := model.Meta("no.such.key"); ok {
		t.Fatal("a missing key was found")
	}
	if !model.IsEOG(info.TokenEOS) {
		t.Fatal("eos is not end of generation")
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	text := "Hello, world! Ünïcödé 🙂"
	tokens, err := model.Tokenize(text, TokenizeOptions{})
	if err != nil || len(tokens) <= 3 {
		t.Fatalf("%v %v", tokens, err)
	}
	if back, _ := model.Detokenize(tokens, false); back != text {
		t.Fatalf("round trip %q", back)
	}
	special, _ := model.Tokenize("<|im_start|>user", TokenizeOptions{ParseSpecial: true})
	plain, _ := model.Tokenize("<|im_start|>user", TokenizeOptions{})
	if len(special) >= len(plain) {
		t.Fatalf("special %v plain %v", special, plain)
	}
	if back, _ := model.Detokenize(special, true); back != "<|im_start|>user" {
		t.Fatalf("rendered %q", back)
	}
	if empty, err := model.Tokenize("", TokenizeOptions{}); err != nil || len(empty) != 0 {
		t.Fatalf("%v %v", empty, err)
	}
	_, err = model.Detokenize([]int32{1, 2, 1000000}, false)
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "2") {
		t.Fatalf("message %q does not name the index", e.Message)
	}
}

func TestChatTemplate(t *testing.T) {
	msgs := []ChatMessage{{"system", "Be brief."}, {"user", "Hi"}}
	own, err := model.ApplyChatTemplate(msgs, "", true)
	if err != nil || !strings.Contains(own, "<|im_start|>user\nHi<|im_end|>") || !strings.HasSuffix(own, "<|im_start|>assistant\n") {
		t.Fatalf("%q %v", own, err)
	}
	chatml, err := model.ApplyChatTemplate(msgs, "chatml", false)
	if err != nil || !strings.Contains(chatml, "<|im_start|>system\nBe brief.<|im_end|>") || strings.HasSuffix(chatml, "assistant\n") {
		t.Fatalf("%q %v", chatml, err)
	}
	_, err = model.ApplyChatTemplate([]ChatMessage{{"wizard", "x"}}, "", true)
	wantStatus(t, err, ErrInvalidArgument)
	_, err = model.ApplyChatTemplate([]ChatMessage{{"user", "x"}}, "no-such-family", true)
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Message, "chatml") {
		t.Fatalf("unknown template: %v", err)
	}
}

func TestCacheAndSession(t *testing.T) {
	before, _ := cache.Stats()
	s := chatSession(t, nil)
	during, _ := cache.Stats()
	if during.NSequences != before.NSequences+1 {
		t.Fatalf("sequences %d -> %d", before.NSequences, during.NSequences)
	}
	prompt, _ := model.Tokenize(chatPrompt, TokenizeOptions{ParseSpecial: true})
	tokens, err := s.Tokens()
	if err != nil || !equal(tokens, prompt) || s.NTokens() != len(prompt) {
		t.Fatalf("tokens %v %v", tokens, err)
	}
	logits, err := s.Logits()
	if err != nil || len(logits) != 49152 || math.IsNaN(float64(logits[0])) {
		t.Fatalf("logits %d %v", len(logits), err)
	}
	s.Close()
	after, _ := cache.Stats()
	if after.NSequences != before.NSequences {
		t.Fatalf("sequences after close %d", after.NSequences)
	}
	wantStatus(t, s.Append(context.Background(), "x", TokenizeOptions{}), ErrInvalidArgument)
}

func TestGenerateStreams(t *testing.T) {
	a := chatSession(t, nil)
	defer a.Close()
	var streamed strings.Builder
	result, err := a.Generate(context.Background(), maxTokens, &GenerateOptions{OnToken: func(_ int32, piece string) bool {
		streamed.WriteString(piece)
		return true
	}})
	if err != nil || len(result.Tokens) != maxTokens || result.StopReason != StopMaxTokens || result.Text == "" {
		t.Fatalf("%+v %v", result, err)
	}
	if streamed.String() != result.Text {
		t.Fatalf("streamed %q, result %q", streamed.String(), result.Text)
	}

	b := chatSession(t, nil)
	defer b.Close()
	pieces, end := b.Stream(context.Background(), maxTokens, nil)
	var joined []string
	for piece := range pieces {
		joined = append(joined, piece)
	}
	last := <-end
	if last.Err != nil || len(joined) < 2 || strings.Join(joined, "") != result.Text || !equal(last.Result.Tokens, result.Tokens) {
		t.Fatalf("stream %q %+v", joined, last)
	}
}

func TestStopStringAndCallbackStop(t *testing.T) {
	s := chatSession(t, nil)
	defer s.Close()
	full, _ := s.Fork()
	text := mustGenerate(t, full, maxTokens).Text
	full.Close()
	word := strings.Fields(text)[1]
	result, err := s.Generate(context.Background(), maxTokens, &GenerateOptions{Stop: []string{word}})
	if err != nil || result.StopReason != StopString || strings.Contains(result.Text, word) {
		t.Fatalf("stop %q: %+v %v", word, result, err)
	}
	result, err = s.Generate(context.Background(), maxTokens, &GenerateOptions{OnToken: func(int32, string) bool { return false }})
	if err != nil || result.StopReason != StopCallback || len(result.Tokens) != 1 {
		t.Fatalf("%+v %v", result, err)
	}
}

func TestContextCancelFromAnotherGoroutine(t *testing.T) {
	s := chatSession(t, nil)
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	firstToken := make(chan struct{})
	go func() {
		<-firstToken
		cancel()
	}()
	n := 0
	result, err := s.Generate(ctx, 64, &GenerateOptions{OnToken: func(int32, string) bool {
		if n++; n == 1 {
			close(firstToken)
			select { // the next step comes after the cancel
			case <-ctx.Done():
			case <-time.After(30 * time.Second):
			}
		}
		return true
	}})
	wantStatus(t, err, ErrCancelled)
	// One token, or two when kiln's cancel (from the context's watcher) came after the next step
	// began: the callback then stops the generate on the done context.
	if !errors.Is(err, context.Canceled) || result.StopReason != StopCancelled || len(result.Tokens) < 1 || len(result.Tokens) > 2 {
		t.Fatalf("%+v %v", result, err)
	}

	// Session.Cancel from another goroutine, without a context: it lands before the next step.
	first, cancelled := make(chan struct{}), make(chan struct{})
	go func() {
		<-first
		s.Cancel()
		close(cancelled)
	}()
	n = 0
	result, err = s.Generate(context.Background(), 64, &GenerateOptions{OnToken: func(int32, string) bool {
		if n++; n == 1 {
			close(first)
			<-cancelled
		}
		return true
	}})
	if err != nil || result.StopReason != StopCancelled || len(result.Tokens) != 1 {
		t.Fatalf("%+v %v", result, err)
	}
	// A context already done is refused up front, changing nothing.
	before := s.NTokens()
	_, err = s.Generate(ctx, 4, nil)
	wantStatus(t, err, ErrCancelled)
	if s.NTokens() != before {
		t.Fatalf("tokens %d -> %d", before, s.NTokens())
	}
}

func TestForkAndRewind(t *testing.T) {
	s := chatSession(t, nil)
	defer s.Close()
	prompt, _ := s.Tokens()
	f, err := s.Fork()
	if err != nil {
		t.Fatal(err)
	}
	a := mustGenerate(t, s, maxTokens)
	if f.NTokens() != len(prompt) {
		t.Fatalf("the fork changed: %d", f.NTokens())
	}
	b := mustGenerate(t, f, maxTokens)
	f.Close()
	if !equal(a.Tokens, b.Tokens) {
		t.Fatalf("fork %v parent %v", b.Tokens, a.Tokens)
	}
	if err := s.Rewind(maxTokens); err != nil {
		t.Fatal(err)
	}
	if now, _ := s.Tokens(); !equal(now, prompt) {
		t.Fatal("rewind did not restore the prompt")
	}
	if again := mustGenerate(t, s, maxTokens); !equal(again.Tokens, a.Tokens) {
		t.Fatalf("regenerated %v, first %v", again.Tokens, a.Tokens)
	}
	wantStatus(t, s.Rewind(1000000), ErrOutOfRange)
}

func TestLogprobs(t *testing.T) {
	s := chatSession(t, &SamplerOptions{NLogprobs: 5})
	defer s.Close()
	logits, _ := s.Logits()
	argmax := 0
	for i, x := range logits {
		if x > logits[argmax] {
			argmax = i
		}
	}
	result := mustGenerate(t, s, 1)
	top, err := s.Logprobs()
	if err != nil || len(top) != 5 || top[0].Token != result.Tokens[0] || int(top[0].Token) != argmax {
		t.Fatalf("%v %v (argmax %d)", top, err, argmax)
	}
	for i := 1; i < len(top); i++ {
		if top[i].Logprob > top[i-1].Logprob || top[i].Logprob > 0 {
			t.Fatalf("not sorted log-probabilities: %v", top)
		}
	}
}

func TestNgramStrategyIsLosslessWithMetrics(t *testing.T) {
	text := strings.Repeat("one two three four five six seven eight. ", 4) + "one two three"
	plain, _ := cache.NewSession(nil)
	plain.Append(context.Background(), text, TokenizeOptions{})
	expected := mustGenerate(t, plain, maxTokens)
	plain.Close()
	st, err := NewNgramStrategy(NgramOptions{MaxDraft: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, _ := cache.NewSession(nil)
	defer s.Close()
	s.Append(context.Background(), text, TokenizeOptions{})
	if err := s.SetStrategy(st); err != nil {
		t.Fatal(err)
	}
	if got := mustGenerate(t, s, maxTokens); !equal(got.Tokens, expected.Tokens) {
		t.Fatalf("with strategy %v, plain %v", got.Tokens, expected.Tokens)
	}
	m, _ := s.SpecMetrics()
	if m.Steps <= 0 || m.Drafted <= 0 || m.Accepted > m.Drafted || m.TargetPassesPerToken > 1 {
		t.Fatalf("metrics %+v", m)
	}
	s.SetStrategy(nil)
	_, err = NewNgramStrategy(NgramOptions{MaxDraft: -1})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "max_draft") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestDraftStrategy(t *testing.T) {
	// The model drafting for itself: a draft model needs only the target's vocabulary size.
	plain := chatSession(t, nil)
	expected := mustGenerate(t, plain, maxTokens)
	plain.Close()
	draft, err := NewDraftStrategy(model, modelPath, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer draft.Close()
	s := chatSession(t, nil)
	defer s.Close()
	s.SetStrategy(draft)
	defer s.SetStrategy(nil)
	if got := mustGenerate(t, s, maxTokens); !equal(got.Tokens, expected.Tokens) {
		t.Fatalf("with the draft %v, plain %v", got.Tokens, expected.Tokens)
	}
	if m, _ := s.SpecMetrics(); m.Drafted <= 0 || m.Accepted <= 0 || m.Accepted > m.Drafted {
		t.Fatalf("metrics %+v", m)
	}
	_, err = s.SaveState() // a draft model cannot save its state
	wantStatus(t, err, ErrUnsupported)
	_, err = NewDraftStrategy(model, filepath.Join(t.TempDir(), "missing-draft.gguf"), 0, 0)
	wantStatus(t, err, ErrIO)
}

func TestMedusaStrategy(t *testing.T) {
	// The repository's trained head for the default model: greedy output is plain decoding's.
	head := filepath.Join("..", "..", "models", "SmolLM2-135M-Instruct.medusa.gguf")
	plain := chatSession(t, nil)
	expected := mustGenerate(t, plain, maxTokens)
	plain.Close()
	medusa, err := NewMedusaStrategy(model, head, MedusaOptions{NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer medusa.Close()
	s := chatSession(t, nil)
	defer s.Close()
	s.SetStrategy(medusa)
	defer s.SetStrategy(nil)
	if got := mustGenerate(t, s, maxTokens); !equal(got.Tokens, expected.Tokens) {
		t.Fatalf("with medusa %v, plain %v", got.Tokens, expected.Tokens)
	}
	m, err := s.SpecMetrics()
	if err != nil || m.Steps <= 0 || m.Drafted <= 0 || m.Accepted > m.Drafted ||
		math.Abs(m.MeanAcceptedPerStep-float64(m.Accepted)/float64(m.Steps)) > 1e-9 ||
		m.TargetPassesPerToken <= 0 || m.TargetPassesPerToken > 1 {
		t.Fatalf("metrics %+v (%v)", m, err)
	}
	// Without the n-gram candidates merged in: the heads' tree alone, still exact.
	alone, err := NewMedusaStrategy(model, head, MedusaOptions{NThreads: 1, NoMergeNgram: true})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	expectPlainOutput(t, alone, expected.Tokens, "medusa without n-gram merge")
	// A model is not a head trained for it; a missing file names itself.
	_, err = NewMedusaStrategy(model, modelPath, MedusaOptions{})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "not a medusa head") {
		t.Fatalf("message %q", e.Message)
	}
	missing := filepath.Join(t.TempDir(), "missing.medusa.gguf")
	_, err = NewMedusaStrategy(model, missing, MedusaOptions{})
	if e := wantStatus(t, err, ErrIO); !strings.Contains(e.Message, missing) {
		t.Fatalf("message %q", e.Message)
	}
	_, err = NewMedusaStrategy(model, head, MedusaOptions{MaxDraft: -1})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "max_draft") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestStreamCancelledByContext(t *testing.T) {
	s := chatSession(t, nil)
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	pieces, end := s.Stream(ctx, 64, nil)
	<-pieces
	cancel() // the consumer stops reading: the generate ends at the next token
	for range pieces {
	}
	last := <-end
	wantStatus(t, last.Err, ErrCancelled)
	if last.Result.StopReason != StopCancelled || len(last.Result.Tokens) >= 64 {
		t.Fatalf("%+v", last.Result)
	}
	if err := s.Rewind(1); err != nil { // the session takes calls again
		t.Fatal(err)
	}
}

func TestSubmitPollStepMatchesBlocking(t *testing.T) {
	ref := chatSession(t, nil)
	expected := mustGenerate(t, ref, maxTokens)
	ref.Close()
	s, _ := cache.NewSession(nil)
	defer s.Close()
	if err := s.Submit(Request{Text: chatPrompt, ParseSpecial: true, MaxTokens: maxTokens}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s.Append(context.Background(), "busy", TokenizeOptions{}), ErrBusy)
	var text []byte
	var tokens []int32
	steps := int32(0)
	for {
		r, err := s.Poll()
		if err != nil {
			t.Fatal(err)
		}
		text = append(text, r.Text...)
		tokens = append(tokens, r.Tokens...)
		if r.Done {
			if r.Err != nil || r.StopReason != StopMaxTokens {
				t.Fatalf("%+v", r)
			}
			break
		}
		step, err := cache.Step(5)
		if err != nil {
			t.Fatal(err)
		}
		steps += step.NSteps
	}
	if steps < maxTokens || !equal(tokens, expected.Tokens) || string(text) != expected.Text {
		t.Fatalf("steps %d tokens %v text %q", steps, tokens, text)
	}
	if err := s.Append(context.Background(), " more", TokenizeOptions{}); err != nil {
		t.Fatal(err) // takes calls again after done
	}
}

func TestWorkerAndRequestErrors(t *testing.T) {
	s, _ := cache.NewSession(nil)
	defer s.Close()
	wantStatus(t, s.Submit(Request{MaxTokens: 4}), ErrInvalidArgument) // empty session, no prompt
	_, err := s.Poll()
	wantStatus(t, err, ErrInvalidArgument) // nothing submitted yet
	// Queued and cancelled: the request fails with ErrCancelled and keeps nothing.
	s.Submit(Request{Text: chatPrompt, ParseSpecial: true, MaxTokens: maxTokens})
	s.Cancel()
	r, err := s.Poll()
	for err == nil && !r.Done {
		cache.Step(0)
		r, err = s.Poll()
	}
	if err != nil || r.Err == nil || !errors.Is(r.Err, ErrCancelled) || s.NTokens() != 0 {
		t.Fatalf("%+v %v", r, err)
	}
	if err := cache.StartWorker(); err != nil {
		t.Fatal(err)
	}
	defer cache.StopWorker()
	s.Submit(Request{Text: chatPrompt, ParseSpecial: true, MaxTokens: maxTokens})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all, err := s.Wait(ctx, time.Millisecond)
	if err != nil || all.Err != nil || len(all.Tokens) != maxTokens || len(all.Text) == 0 {
		t.Fatalf("%+v %v", all, err)
	}
}

func TestSavedStateContinues(t *testing.T) {
	s := chatSession(t, nil)
	defer s.Close()
	mustGenerate(t, s, 4)
	state, err := s.SaveState()
	if err != nil || len(state) == 0 {
		t.Fatal(err)
	}
	expected := mustGenerate(t, s, maxTokens)
	r, _ := cache.NewSession(nil)
	defer r.Close()
	wantStatus(t, r.LoadState(state[:len(state)/2]), ErrFormat)
	if err := r.LoadState(state); err != nil {
		t.Fatal(err)
	}
	if got := mustGenerate(t, r, maxTokens); !equal(got.Tokens, expected.Tokens) {
		t.Fatalf("restored %v, original %v", got.Tokens, expected.Tokens)
	}
}

func TestBadArguments(t *testing.T) {
	_, err := model.NewCache(&CacheOptions{BlockSize: -1})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "block_size") {
		t.Fatalf("message %q", e.Message)
	}
	_, err = cache.NewSession(&SamplerOptions{RepeatPenalty: -1})
	wantStatus(t, err, ErrInvalidArgument)
	s, _ := cache.NewSession(nil)
	defer s.Close()
	_, err = s.Generate(context.Background(), 4, nil)
	wantStatus(t, err, ErrInvalidArgument) // empty session
	wantStatus(t, s.AppendTokens(context.Background(), []int32{10000000}), ErrInvalidArgument)
}

func mustGenerate(t *testing.T, s *Session, n int) GenerateResult {
	t.Helper()
	r, err := s.Generate(context.Background(), n, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// expectPlainOutput runs strategy on a fresh chat session and checks that its greedy output is
// plain decoding's (expected).
func expectPlainOutput(t *testing.T, strategy *Strategy, expected []int32, what string) {
	t.Helper()
	s := chatSession(t, nil)
	defer s.Close()
	if err := s.SetStrategy(strategy); err != nil {
		t.Fatal(err)
	}
	defer s.SetStrategy(nil)
	if got := mustGenerate(t, s, maxTokens); !equal(got.Tokens, expected) {
		t.Fatalf("%s %v, plain %v", what, got.Tokens, expected)
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
