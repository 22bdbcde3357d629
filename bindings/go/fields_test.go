package kiln

// The parts of kiln.h added after the first bindings: the cache's step size, backend and MLA
// prefill, the EAGLE strategy, file inspection, metadata listing, scoring and state files. The
// tiny deepseek2 model and the EAGLE head are written by scripts/test_bindings.sh (kiln-mkmodel,
// kiln-mkeagle) into $KILN_BINDINGS_FIXTURES.

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fixture(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("KILN_BINDINGS_FIXTURES")
	if dir == "" {
		t.Fatal("KILN_BINDINGS_FIXTURES is not set: run scripts/test_bindings.sh, which writes the fixtures")
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("fixture %s is missing (run scripts/test_bindings.sh): %v", path, err)
	}
	return path
}

func metaValue(entries []MetaEntry, key string) string {
	for _, e := range entries {
		if e.Key == key {
			return e.Value
		}
	}
	return ""
}

func TestCacheBackendCPUAndCUDAFallback(t *testing.T) {
	if own := cache.Backend(); !strings.HasPrefix(own, "cpu") || strings.Contains(own, "requested") {
		t.Fatalf("default backend %q", own)
	}
	pinned, err := model.NewCache(&CacheOptions{NCtx: 256, NThreads: 2, PinThreads: true})
	if err != nil {
		t.Fatal(err)
	}
	if b := pinned.Backend(); !strings.Contains(b, "workers pinned") {
		t.Fatalf("PinThreads: backend %q", b)
	}
	pinned.Close()
	c, err := model.NewCache(&CacheOptions{NCtx: 256, Backend: BackendCUDA, CUDADevice: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	chosen := c.Backend()
	if strings.HasPrefix(chosen, "cpu") {
		// No CUDA module, driver or device here: the cache still runs, on the CPU, and says why.
		const prefix = "; cuda requested, running on the CPU: "
		i := strings.Index(chosen, prefix)
		if i < 0 || strings.TrimSpace(chosen[i+len(prefix):]) == "" {
			t.Fatalf("fallback without a reason: %q", chosen)
		}
	} else if !strings.HasPrefix(chosen, "cuda") {
		t.Fatalf("backend %q", chosen)
	}
	s, _ := c.NewSession(nil)
	defer s.Close()
	if err := s.Append(context.Background(), "Hello", TokenizeOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := mustGenerate(t, s, 2); len(r.Tokens) != 2 {
		t.Fatalf("%v", r)
	}
	_, err = model.NewCache(&CacheOptions{NCtx: 256, Backend: Backend(7)})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "backend") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestCacheStepTokens(t *testing.T) {
	prompt, _ := model.Tokenize(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 12), TokenizeOptions{})
	if len(prompt) <= 100 {
		t.Fatalf("prompt of %d tokens", len(prompt))
	}
	// One step computes the whole prompt (under the 256-token chunk) by default, 48 tokens with
	// StepTokens 48. New caches: no prefix cache hit.
	for _, tc := range []struct{ stepTokens, want int32 }{{0, int32(len(prompt))}, {48, 48}} {
		c, err := model.NewCache(&CacheOptions{NCtx: 256, StepTokens: tc.stepTokens})
		if err != nil {
			t.Fatal(err)
		}
		s, _ := c.NewSession(nil)
		if err := s.Submit(Request{Tokens: prompt, MaxTokens: 0}); err != nil {
			t.Fatal(err)
		}
		if r, err := c.Step(0); err != nil || r.NTokens != int64(tc.want) {
			t.Fatalf("StepTokens %d: first step %+v %v, want %d tokens", tc.stepTokens, r, err, tc.want)
		}
		for p, err := s.Poll(); !p.Done; p, err = s.Poll() {
			if err != nil {
				t.Fatal(err)
			}
			c.Step(0)
		}
		if s.NTokens() != len(prompt) {
			t.Fatalf("%d tokens, want %d", s.NTokens(), len(prompt))
		}
		s.Close()
		c.Close()
	}
	_, err := model.NewCache(&CacheOptions{NCtx: 256, StepTokens: -1})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "step_tokens") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestMLAPrefillOnDeepseek2(t *testing.T) {
	m, err := LoadModel(context.Background(), fixture(t, "tiny-deepseek2.gguf"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if info, _ := m.Info(); info.Architecture != "deepseek2" {
		t.Fatalf("architecture %q", info.Architecture)
	}
	// A prompt of more than 128 tokens in one chunk: measured runs it decompressed, whose logits
	// agree with the absorbed form's to float rounding but not bit for bit.
	prompt, _ := m.Tokenize(strings.Repeat("the quick brown fox jumps ", 30), TokenizeOptions{})
	if len(prompt) <= 128 {
		t.Fatalf("prompt of %d tokens", len(prompt))
	}
	logits := func(mode MLAPrefill) []float32 {
		c, err := m.NewCache(&CacheOptions{NThreads: 2, MLAPrefill: mode})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, _ := c.NewSession(nil)
		defer s.Close()
		if err := s.AppendTokens(context.Background(), prompt); err != nil {
			t.Fatal(err)
		}
		l, err := s.Logits()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	absorbed, measured := logits(MLAPrefillAbsorbed), logits(MLAPrefillMeasured)
	var scale, diff float64
	for i := range absorbed {
		scale = math.Max(scale, math.Abs(float64(absorbed[i])))
		diff = math.Max(diff, math.Abs(float64(absorbed[i]-measured[i])))
	}
	if diff == 0 {
		t.Fatal("measured ran the absorbed form (bitwise equal logits)")
	}
	if diff > 1e-3*scale {
		t.Fatalf("max difference %g, scale %g", diff, scale)
	}
	_, err = m.NewCache(&CacheOptions{MLAPrefill: MLAPrefill(7)})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "mla_prefill 7") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestEagleStrategy(t *testing.T) {
	// An untrained head from kiln-mkeagle: greedy output is still plain decoding's (exact
	// verification), and it drafts.
	head := fixture(t, "SmolLM2-135M-Instruct.eagle.gguf")
	plain := chatSession(t, nil)
	expected := mustGenerate(t, plain, maxTokens)
	plain.Close()
	eagle, err := NewEagleStrategy(model, head, EagleOptions{TopK: 4, MaxDepth: 3, NThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eagle.Close()
	s := chatSession(t, nil)
	defer s.Close()
	if err := s.SetStrategy(eagle); err != nil {
		t.Fatal(err)
	}
	if got := mustGenerate(t, s, maxTokens); !equal(got.Tokens, expected.Tokens) {
		t.Fatalf("eagle %v, plain %v", got.Tokens, expected.Tokens)
	}
	if m, _ := s.SpecMetrics(); m.Steps == 0 || m.Drafted == 0 || m.Accepted > m.Drafted {
		t.Fatalf("%+v", m)
	}
	s.SetStrategy(nil)
	// Without the n-gram candidates merged in: the head's tree alone, still exact.
	alone, err := NewEagleStrategy(model, head, EagleOptions{TopK: 4, MaxDepth: 3, NThreads: 1, NoMergeNgram: true})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	expectPlainOutput(t, alone, expected.Tokens, "eagle without n-gram merge")
	_, err = NewEagleStrategy(model, head, EagleOptions{TopK: 65})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "top_k") {
		t.Fatalf("message %q", e.Message)
	}
	_, err = NewEagleStrategy(model, modelPath, EagleOptions{}) // a model, not a head
	wantStatus(t, err, ErrInvalidArgument)
}

func TestGGUFInspectionAndMetadata(t *testing.T) {
	g, err := OpenGGUF(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := g.Metadata()
	if err != nil || metaValue(entries, "general.architecture") != `"llama"` || len(g.Unsupported()) != 0 {
		t.Fatalf("%v %v unsupported %q", entries, err, g.Unsupported())
	}
	g.Close()
	modelEntries, err := model.Metadata()
	if err != nil || len(modelEntries) != len(entries) || metaValue(modelEntries, "general.architecture") != `"llama"` {
		t.Fatalf("model metadata %v %v", modelEntries, err)
	}
	// An eagle head is a valid GGUF that kiln cannot run as a model: the problems are listed.
	g, err = OpenGGUF(fixture(t, "SmolLM2-135M-Instruct.eagle.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	entries, _ = g.Metadata()
	if problems := g.Unsupported(); metaValue(entries, "general.architecture") != `"eagle"` ||
		len(problems) == 0 || !strings.Contains(problems[0], "eagle") {
		t.Fatalf("eagle head: unsupported %q", problems)
	}
	_, err = OpenGGUF(filepath.Join(t.TempDir(), "missing.gguf"))
	wantStatus(t, err, ErrIO)
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	os.WriteFile(bad, append([]byte("GGUF"), make([]byte, 60)...), 0o644)
	_, err = OpenGGUF(bad)
	wantStatus(t, err, ErrFormat)
}

func TestScoreAndStateFiles(t *testing.T) {
	tokens, _ := model.Tokenize("The capital of France is Paris.", TokenizeOptions{})
	s, _ := cache.NewSession(nil)
	defer s.Close()
	scores, err := s.Score(tokens)
	if err != nil || len(scores) != len(tokens)-1 || s.NTokens() != len(tokens) {
		t.Fatalf("%v %v", scores, err)
	}
	for _, x := range scores {
		if x > 0 || math.IsNaN(float64(x)) {
			t.Fatalf("not a log-probability: %v", scores)
		}
	}
	path := filepath.Join(t.TempDir(), "npc.state")
	if err := s.SaveStateFile(path, StateOptions{NoKV: true}); err != nil {
		t.Fatal(err)
	}
	full, _ := s.SaveState()
	small, _ := s.SaveStateWith(StateOptions{NoKV: true})
	if len(small) >= len(full) {
		t.Fatalf("tokens-only state %d bytes, full %d", len(small), len(full))
	}
	expected := mustGenerate(t, s, 4)
	r, _ := cache.NewSession(nil)
	defer r.Close()
	if err := r.LoadStateFile(path); err != nil {
		t.Fatal(err)
	}
	if got := mustGenerate(t, r, 4); !equal(got.Tokens, expected.Tokens) {
		t.Fatalf("restored %v, original %v", got.Tokens, expected.Tokens)
	}
	wantStatus(t, r.LoadStateFile(filepath.Join(t.TempDir(), "missing.state")), ErrIO)
}

func TestSamplerPenaltiesAndLogitBias(t *testing.T) {
	plain := chatSession(t, nil)
	first := mustGenerate(t, plain, 1).Tokens[0]
	plain.Close()
	// Banning the greedy choice makes greedy decoding pick another token.
	banned := chatSession(t, &SamplerOptions{LogitBias: map[int32]float32{first: float32(math.Inf(-1))}})
	defer banned.Close()
	if got := mustGenerate(t, banned, 1).Tokens[0]; got == first {
		t.Fatalf("banned token %d was generated", first)
	}
	s := chatSession(t, &SamplerOptions{TypicalP: 0.9, FrequencyPenalty: 0.5, PresencePenalty: 0.5, PenaltyLastN: -1})
	defer s.Close()
	if r := mustGenerate(t, s, 4); len(r.Tokens) != 4 {
		t.Fatalf("%v", r)
	}
	_, err := cache.NewSession(&SamplerOptions{PenaltyLastN: -2})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "penalty_last_n") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestLoadLogsItsLines(t *testing.T) {
	type line struct {
		level LogLevel
		text  string
	}
	var lines []line
	opts := &LoadOptions{Log: func(level LogLevel, text string) { lines = append(lines, line{level, text}) }}
	m, err := LoadModel(context.Background(), modelPath, opts)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	info := false
	for _, l := range lines {
		info = info || (l.level == LogInfo && l.text != "")
	}
	if !info {
		t.Fatalf("no info line: %v", lines)
	}
	// A failed load logs its error, the message the error carries.
	lines = nil
	_, err = LoadModel(context.Background(), filepath.Join(t.TempDir(), "missing.gguf"), opts)
	e := wantStatus(t, err, ErrIO)
	found := false
	for _, l := range lines {
		found = found || (l.level == LogError && l.text == e.Message)
	}
	if !found {
		t.Fatalf("%v does not log %q", lines, e.Message)
	}
}

func TestNgramAndDraftOptions(t *testing.T) {
	text := strings.Repeat("one two three four five six seven eight. ", 4) + "one two three"
	plain, _ := cache.NewSession(nil)
	plain.Append(context.Background(), text, TokenizeOptions{})
	expected := mustGenerate(t, plain, maxTokens)
	plain.Close()
	zero, beta := int32(0), 0.0
	strategies := map[string]func() (*Strategy, error){
		"ngram": func() (*Strategy, error) {
			return NewNgramStrategy(NgramOptions{MaxDraft: 4, MaxSkip: &zero, NoAdaptive: true, FixedPassCostBeta: &beta})
		},
		"draft": func() (*Strategy, error) {
			return NewDraftStrategyWith(model, modelPath, DraftOptions{MaxDraft: 3, NThreads: 1, NCtx: 256,
				NoAdaptive: true, FixedPassCostBeta: &beta})
		},
	}
	for name, create := range strategies {
		st, err := create()
		if err != nil {
			t.Fatal(name, err)
		}
		s, _ := cache.NewSession(nil)
		s.Append(context.Background(), text, TokenizeOptions{})
		s.SetStrategy(st)
		if got := mustGenerate(t, s, maxTokens); !equal(got.Tokens, expected.Tokens) {
			t.Fatalf("%s: %v, plain %v", name, got.Tokens, expected.Tokens)
		}
		if m, _ := s.SpecMetrics(); m.Drafted <= 0 || m.Accepted > m.Drafted {
			t.Fatalf("%s: metrics %+v", name, m)
		}
		s.SetStrategy(nil)
		s.Close()
		st.Close()
	}
	negative := int32(-1)
	_, err := NewNgramStrategy(NgramOptions{MaxSkip: &negative})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "max_skip") {
		t.Fatalf("message %q", e.Message)
	}
	_, err = NewDraftStrategyWith(model, modelPath, DraftOptions{NCtx: -1})
	if e := wantStatus(t, err, ErrInvalidArgument); !strings.Contains(e.Message, "n_ctx") {
		t.Fatalf("message %q", e.Message)
	}
}

func TestRequestCallbacksOnTheWorker(t *testing.T) {
	plain := chatSession(t, nil)
	expected := mustGenerate(t, plain, maxTokens)
	plain.Close()
	s, _ := cache.NewSession(nil)
	defer s.Close()
	var pieces strings.Builder
	type end struct {
		err    error
		reason StopReason
		n      int32
	}
	done := make(chan end, 1)
	if err := cache.StartWorker(); err != nil {
		t.Fatal(err)
	}
	err := s.Submit(Request{Text: chatPrompt, ParseSpecial: true, MaxTokens: maxTokens,
		OnToken: func(_ int32, piece string) bool { pieces.WriteString(piece); return true },
		OnDone:  func(err error, reason StopReason, n int32) { done <- end{err, reason, n} }})
	if err != nil {
		cache.StopWorker()
		t.Fatal(err)
	}
	got := <-done
	cache.StopWorker()
	if got.err != nil || got.reason != StopMaxTokens || got.n != maxTokens || pieces.String() != expected.Text {
		t.Fatalf("%+v, text %q, want %q", got, pieces.String(), expected.Text)
	}
	if p, _ := s.Poll(); !p.Done {
		t.Fatal("not done after OnDone")
	}
	// OnToken returning false ends the request with StopCallback.
	if err := s.Submit(Request{Text: " more", MaxTokens: 4, OnToken: func(int32, string) bool { return false }}); err != nil {
		t.Fatal(err)
	}
	p, err := s.Poll()
	for err == nil && !p.Done {
		cache.Step(0)
		p, err = s.Poll()
	}
	if err != nil || p.Err != nil || p.StopReason != StopCallback {
		t.Fatalf("%+v %v", p, err)
	}
}
