//! The safe binding on the default model (SmolLM2-135M-Instruct Q4_1, fetched by
//! scripts/fetch_model.sh into $KILN_MODEL_DIR or ~/.cache/kiln): every part of the C API it
//! wraps, greedy (so results are exact), with few tokens so the whole file runs in seconds.
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use kiln::{
    Backend, Cache, CacheOptions, ChatMessage, EagleOptions, GgufFile, MlaPrefill, Model, NgramOptions,
    RequestCallbacks, RequestOptions, Sampler, SamplerOptions, StateOptions, Status, StopReason, Strategy,
    TokenizeFlags,
};

const CHAT_PROMPT: &str = "<|im_start|>user\nName three fruits.<|im_end|>\n<|im_start|>assistant\n";
const MAX: i32 = 12; // tokens per generate: enough to compare texts, cheap on two cores

fn model_path() -> PathBuf {
    let dir = std::env::var_os("KILN_MODEL_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/kiln"));
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "default model {} is missing: run scripts/fetch_model.sh", path.display());
    path
}

// One model and cache for the whole file: both are Send + Sync, and the tests run on several
// threads at once (which also exercises sessions of one cache from many threads). A locked slot
// rather than OnceLock, which needs Rust 1.70 (the binding builds with Debian 12's 1.63).
fn once<T>(slot: &'static Mutex<Option<&'static T>>, make: impl FnOnce() -> T) -> &'static T {
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    *slot.get_or_insert_with(|| Box::leak(Box::new(make())))
}

fn model() -> &'static Model {
    static MODEL: Mutex<Option<&'static Model>> = Mutex::new(None);
    once(&MODEL, || Model::load(model_path()).expect("loading the default model"))
}

fn cache() -> &'static Cache {
    static CACHE: Mutex<Option<&'static Cache>> = Mutex::new(None);
    once(&CACHE, || model().cache(&CacheOptions { n_ctx: 1024, ..Default::default() }).unwrap())
}

fn chat_session() -> kiln::Session {
    let mut s = cache().session().unwrap();
    s.append(CHAT_PROMPT, TokenizeFlags::PARSE_SPECIAL).unwrap();
    s
}

/// A file scripts/test_bindings.sh writes into $KILN_BINDINGS_FIXTURES with kiln-mkmodel and
/// kiln-mkeagle.
fn fixture(name: &str) -> PathBuf {
    let dir = std::env::var_os("KILN_BINDINGS_FIXTURES")
        .filter(|d| !d.is_empty())
        .expect("KILN_BINDINGS_FIXTURES is not set: run scripts/test_bindings.sh, which writes the fixtures");
    let path = PathBuf::from(dir).join(name);
    assert!(path.is_file(), "fixture {} is missing: run scripts/test_bindings.sh", path.display());
    path
}

fn max(n: i32) -> RequestOptions<'static> {
    RequestOptions { max_tokens: n, ..Default::default() }
}

#[test]
fn versions() {
    assert_eq!(kiln::version().split('.').count(), 3);
    assert_eq!(kiln::abi_version(), 1);
    assert!(!kiln::cpu_info().is_empty());
    assert!(!kiln::backends().is_empty());
}

#[test]
fn load_reports_progress_and_can_be_cancelled() {
    let mut seen = Vec::new();
    let m = Model::load_with(model_path(), true, |p| {
        seen.push(p);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(m.info().unwrap().n_vocab > 0);
    assert!(!seen.is_empty());
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "progress went backwards: {seen:?}");
    assert_eq!(*seen.last().unwrap(), 1.0);

    let e = Model::load_with(model_path(), true, |_| ControlFlow::Break(())).err().unwrap();
    assert_eq!(e.status(), Status::Cancelled);
}

#[test]
fn load_logs_its_lines() {
    let mut lines = Vec::new();
    let m = Model::load_with_log(
        model_path(),
        true,
        |_| ControlFlow::Continue(()),
        |level, line| lines.push((level, line.to_owned())),
    )
    .unwrap();
    drop(m);
    assert!(
        lines.iter().any(|(level, line)| *level == kiln::LogLevel::Info && !line.is_empty()),
        "{lines:?}"
    );
    // A failed load logs its error, the message the Error carries.
    lines.clear();
    let missing = "/nonexistent/missing.gguf";
    let e = Model::load_with_log(
        missing,
        true,
        |_| ControlFlow::Continue(()),
        |level, line| lines.push((level, line.to_owned())),
    )
    .err()
    .unwrap();
    assert_eq!(e.status(), Status::Io);
    assert!(lines.contains(&(kiln::LogLevel::Error, e.message().to_owned())), "{lines:?} vs {e}");
}

#[test]
fn panic_in_progress_resumes_in_the_caller() {
    let caught =
        std::panic::catch_unwind(|| Model::load_with(model_path(), true, |_| panic!("from progress")));
    let payload = match caught {
        Err(payload) => payload,
        Ok(_) => panic!("the panic did not reach the caller"),
    };
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"from progress"));
}

#[test]
fn load_errors_carry_status_and_message() {
    let e = Model::load("/nonexistent/missing.gguf").err().unwrap();
    assert_eq!(e.status(), Status::Io);
    assert!(e.message().contains("missing.gguf"), "{e}");
    let bad = std::env::temp_dir().join(format!("kiln-rust-bad-{}.gguf", std::process::id()));
    std::fs::write(&bad, [b"GGUF".as_slice(), &[0xff; 60]].concat()).unwrap();
    let e = Model::load(&bad).err().unwrap();
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(e.status(), Status::Format);
    assert!(e.to_string().starts_with("KILN_ERR_FORMAT: "), "{e}");
}

#[test]
fn info_and_metadata() {
    let info = model().info().unwrap();
    assert_eq!(info.architecture, "llama");
    assert_eq!((info.n_vocab, info.n_layer), (49152, 30));
    let meta = model().metadata().unwrap();
    assert!(meta.len() > 10);
    assert!(meta.iter().any(|(k, v)| k == "general.architecture" && v == "\"llama\""));
    assert_eq!(model().meta("general.architecture").unwrap().as_deref(), Some("\"llama\""));
    assert_eq!(model().meta("no.such.key").unwrap(), None);
    assert!(model().is_eog(info.token_eos));
}

#[test]
fn tokenize_round_trip() {
    let text = "Hello, world! Ünïcödé 🙂";
    let tokens = model().tokenize(text, TokenizeFlags::NONE).unwrap();
    assert!(tokens.len() > 3);
    assert_eq!(model().detokenize(&tokens).unwrap(), text);
    let special = model().tokenize("<|im_start|>user", TokenizeFlags::PARSE_SPECIAL).unwrap();
    let plain = model().tokenize("<|im_start|>user", TokenizeFlags::NONE).unwrap();
    assert!(special.len() < plain.len());
    assert_eq!(model().detokenize_bytes(&special, true).unwrap(), b"<|im_start|>user");
    let e = model().detokenize(&[1, 2, 1_000_000]).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains('2'), "the message names the index: {e}");
}

#[test]
fn chat_template() {
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    let own = model().apply_chat_template(&messages, None, true).unwrap();
    assert!(own.contains("<|im_start|>user\nHi<|im_end|>"), "{own}");
    assert!(own.ends_with("<|im_start|>assistant\n"));
    let chatml = model().apply_chat_template(&messages, Some("chatml"), false).unwrap();
    assert!(chatml.contains("<|im_start|>system\nBe brief.<|im_end|>"));
    let e = model()
        .apply_chat_template(&[ChatMessage { role: "wizard", content: "x" }], None, true)
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = model().apply_chat_template(&[ChatMessage::user("a\0b")], None, true).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("NUL"));
}

#[test]
fn cache_and_session() {
    let cache = model().cache(&CacheOptions { n_ctx: 256, ..Default::default() }).unwrap();
    let mut s = cache.session().unwrap();
    assert_eq!(cache.stats().unwrap().n_sequences, 1);
    s.append(CHAT_PROMPT, TokenizeFlags::PARSE_SPECIAL).unwrap();
    let prompt = model().tokenize(CHAT_PROMPT, TokenizeFlags::PARSE_SPECIAL).unwrap();
    assert_eq!(s.tokens().unwrap(), prompt);
    assert_eq!(s.n_tokens(), prompt.len());
    let logits = s.logits().unwrap();
    assert_eq!(logits.len(), 49152);
    assert!(logits.iter().all(|x| x.is_finite()));
    assert_eq!(cache.stats().unwrap().n_ctx, 256);
    drop(s);
    assert_eq!(cache.stats().unwrap().n_sequences, 0);
    let e = model().cache(&CacheOptions { block_size: 0, ..Default::default() }).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("block_size"), "{e}");
}

#[test]
fn handles_keep_their_parents_alive() {
    // Dropping the model and cache handles first is fine: the session holds both.
    let model = Model::load(model_path()).unwrap();
    let cache = model.cache(&CacheOptions { n_ctx: 128, ..Default::default() }).unwrap();
    let mut s = cache.session().unwrap();
    drop(cache);
    drop(model);
    s.append("Hello", TokenizeFlags::NONE).unwrap();
    assert_eq!(s.generate(&max(2)).unwrap().n_tokens, 2);
}

#[test]
fn generate_and_stream_agree() {
    let mut a = chat_session();
    let mut seen = String::new();
    let generated = a
        .generate_with(&max(MAX), |_, piece| {
            seen.push_str(piece);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(generated.n_tokens, MAX);
    assert_eq!(generated.stop_reason, StopReason::MaxTokens);
    assert_eq!(generated.tokens.len(), MAX as usize);
    assert_eq!(seen, generated.text);

    let mut b = chat_session();
    let mut stream = b.stream(&max(MAX)).unwrap();
    let pieces: Vec<String> = stream.by_ref().collect::<Result<_, _>>().unwrap();
    assert!(pieces.len() > 1);
    assert_eq!(pieces.concat(), generated.text);
    assert_eq!(stream.tokens(), generated.tokens.as_slice());
    assert_eq!(stream.stop_reason(), Some(StopReason::MaxTokens));
}

#[test]
fn dropping_a_stream_cancels_it() {
    let mut s = cache().session().unwrap();
    let options = RequestOptions {
        text: Some(CHAT_PROMPT),
        text_flags: TokenizeFlags::PARSE_SPECIAL,
        max_tokens: 64,
        ..Default::default()
    };
    let mut stream = s.stream(&options).unwrap();
    assert!(!stream.next().unwrap().unwrap().is_empty());
    drop(stream);
    // The request ended (cancelled): the session takes calls again.
    assert!(s.n_tokens() < 64 + 20);
    s.rewind(1).unwrap();
}

#[test]
fn stop_strings_and_callback_stop() {
    let mut s = chat_session();
    let text = s.fork().unwrap().generate(&max(MAX)).unwrap().text;
    let word = text.split_whitespace().nth(1).unwrap().to_string();
    let stopped =
        s.generate(&RequestOptions { max_tokens: MAX, stop: &[&word], ..Default::default() }).unwrap();
    assert_eq!(stopped.stop_reason, StopReason::StopString);
    assert!(!stopped.text.contains(&word));

    let mut s = chat_session();
    let r =
        s.generate_with(
            &max(MAX),
            |t, _| if t >= 0 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) },
        );
    let r = r.unwrap();
    assert_eq!((r.stop_reason, r.n_tokens), (StopReason::Callback, 1));
}

#[test]
fn panic_in_token_callback_resumes_after_generate() {
    let mut s = chat_session();
    let before = s.n_tokens();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.generate_with(&max(MAX), |_, _| panic!("from the token callback"))
    }));
    let payload = match caught {
        Err(payload) => payload,
        Ok(_) => panic!("the panic did not reach the caller"),
    };
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"from the token callback"));
    // The callback's panic stopped the generate after its first token; the session still works.
    assert_eq!(s.n_tokens(), before + 1);
    assert_eq!(s.generate(&max(2)).unwrap().n_tokens, 2);
}

#[test]
fn cancel_from_another_thread() {
    let mut s = chat_session();
    let canceller = s.canceller();
    let (first_tx, first_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        first_rx.recv().unwrap();
        canceller.cancel();
        done_tx.send(()).unwrap();
    });
    let r = s
        .generate_with(&max(64), |_, _| {
            let _ = first_tx.send(());
            // The next decode step comes after the cancel.
            let _ = done_rx.recv_timeout(Duration::from_secs(30));
            ControlFlow::Continue(())
        })
        .unwrap();
    thread.join().unwrap();
    assert_eq!(r.stop_reason, StopReason::Cancelled);
    assert!(r.n_tokens >= 1 && r.n_tokens < 64, "{}", r.n_tokens);
}

#[test]
fn fork_is_independent() {
    let mut s = chat_session();
    let prompt_len = s.n_tokens();
    let mut f = s.fork().unwrap();
    assert_eq!(f.tokens().unwrap(), s.tokens().unwrap());
    let a = s.generate(&max(MAX)).unwrap();
    assert_eq!(f.n_tokens(), prompt_len);
    let b = f.generate(&max(MAX)).unwrap();
    assert_eq!(a, b);
}

#[test]
fn rewind_regenerates() {
    let mut s = chat_session();
    let prompt = s.tokens().unwrap();
    let first = s.generate(&max(MAX)).unwrap();
    s.rewind(MAX as usize).unwrap();
    assert_eq!(s.tokens().unwrap(), prompt);
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, first.tokens);
    let e = s.rewind(1_000_000).err().unwrap();
    assert_eq!(e.status(), Status::OutOfRange);
    assert_eq!(s.n_tokens(), prompt.len() + MAX as usize);
}

#[test]
fn logprobs_and_scoring() {
    let sampler =
        Sampler::new(&SamplerOptions { temperature: 0.0, n_logprobs: 5, ..Default::default() }).unwrap();
    let mut s = cache().session_with(&sampler).unwrap();
    drop(sampler); // the session copied it
    s.append(CHAT_PROMPT, TokenizeFlags::PARSE_SPECIAL).unwrap();
    let logits = s.logits().unwrap();
    let argmax = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as i32;
    let r = s.generate(&max(1)).unwrap();
    let top = s.logprobs().unwrap();
    assert_eq!(top.len(), 5);
    assert_eq!(top[0].token, r.tokens[0]);
    assert_eq!(top[0].token, argmax);
    assert!(top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    assert!(top.iter().all(|t| t.logprob <= 0.0));

    let mut scorer = cache().session().unwrap();
    let tokens = model().tokenize("The capital of France is Paris.", TokenizeFlags::NONE).unwrap();
    let scores = scorer.score(&tokens).unwrap();
    assert_eq!(scores.len(), tokens.len() - 1);
    assert!(scores.iter().all(|x| x.is_finite() && *x <= 0.0));
    let e = Sampler::new(&SamplerOptions { repeat_penalty: 0.0, ..Default::default() }).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
}

#[test]
fn ngram_strategy_is_lossless_with_metrics() {
    let text = "one two three four five six seven eight. ".repeat(4) + "one two three";
    let mut plain = cache().session().unwrap();
    plain.append(&text, TokenizeFlags::NONE).unwrap();
    let expected = plain.generate(&max(MAX)).unwrap();

    let mut s = cache().session().unwrap();
    s.append(&text, TokenizeFlags::NONE).unwrap();
    let strategy = Strategy::ngram(&NgramOptions { max_draft: 4, ..Default::default() }).unwrap();
    assert!(s.set_strategy(Some(strategy)).unwrap().is_none());
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, expected.tokens);
    let m = s.spec_metrics().unwrap();
    assert!(m.steps > 0 && m.drafted > 0 && m.accepted <= m.drafted, "{m:?}");
    assert!(m.generated >= (MAX - 1) as i64 && m.target_passes_per_token <= 1.0, "{m:?}");
    // Detached, it comes back and can serve another session.
    let strategy = s.set_strategy(None).unwrap().expect("the strategy handed back");
    let mut other = cache().session().unwrap();
    other.append(&text, TokenizeFlags::NONE).unwrap();
    other.set_strategy(Some(strategy)).unwrap();
    drop(s);
    drop(other); // destroys the session, then its strategy

    let e = Strategy::ngram(&NgramOptions { max_draft: 0, ..Default::default() }).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("max_draft"), "{e}");
    let e = Strategy::draft(model(), "/nonexistent/draft.gguf", &Default::default()).err().unwrap();
    assert_eq!(e.status(), Status::Io);
}

#[test]
fn draft_strategy() {
    // The model drafting for itself: a draft model needs only the target's vocabulary size.
    let expected = chat_session().generate(&max(MAX)).unwrap().tokens;
    let options = kiln::DraftOptions { max_draft: 3, n_threads: 1, ..Default::default() };
    let draft = Strategy::draft(model(), model_path(), &options).unwrap();
    let mut s = chat_session();
    s.set_strategy(Some(draft)).unwrap();
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, expected);
    let m = s.spec_metrics().unwrap();
    assert!(m.drafted > 0 && m.accepted > 0 && m.accepted <= m.drafted, "{m:?}");
    let e = s.save_state(&StateOptions::default()).err().unwrap(); // a draft model cannot save its state
    assert_eq!(e.status(), Status::Unsupported);
    assert!(!s.save_state(&StateOptions { kv: true, strategy: false }).unwrap().is_empty());
}

#[test]
fn medusa_strategy() {
    // The repository's trained head for the default model: greedy output is plain decoding's.
    let head =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../models/SmolLM2-135M-Instruct.medusa.gguf");
    let expected = chat_session().generate(&max(MAX)).unwrap().tokens;
    let options = kiln::MedusaOptions { n_threads: 1, ..Default::default() };
    let medusa = Strategy::medusa(model(), &head, &options).unwrap();
    let mut s = chat_session();
    s.set_strategy(Some(medusa)).unwrap();
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, expected);
    let m = s.spec_metrics().unwrap();
    assert!(m.steps > 0 && m.drafted > 0 && m.accepted <= m.drafted, "{m:?}");
    assert!((m.mean_accepted_per_step - m.accepted as f64 / m.steps as f64).abs() < 1e-9, "{m:?}");
    assert!(m.target_passes_per_token > 0.0 && m.target_passes_per_token <= 1.0, "{m:?}");
    assert!(kiln::MedusaOptions::default().merge_ngram);
    // Without the n-gram candidates merged in: the heads' tree alone, still exact.
    let no_merge = kiln::MedusaOptions { merge_ngram: false, ..options.clone() };
    let alone = Strategy::medusa(model(), &head, &no_merge).unwrap();
    let mut s = chat_session();
    s.set_strategy(Some(alone)).unwrap();
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, expected);

    // A model is not a head trained for it; a missing file names itself.
    let e = Strategy::medusa(model(), model_path(), &options).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("not a medusa head"), "{e}");
    let missing = "/nonexistent/missing.medusa.gguf";
    let e = Strategy::medusa(model(), missing, &options).err().unwrap();
    assert_eq!(e.status(), Status::Io);
    assert!(e.message().contains(missing), "{e}");
    let e =
        Strategy::medusa(model(), &head, &kiln::MedusaOptions { max_draft: -1, ..options }).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("max_draft"), "{e}");
}

#[test]
fn submit_poll_step_matches_blocking() {
    let expected = chat_session().generate(&max(MAX)).unwrap();
    let cache = cache();
    let mut s = cache.session().unwrap();
    let options = RequestOptions {
        text: Some(CHAT_PROMPT),
        text_flags: TokenizeFlags::PARSE_SPECIAL,
        max_tokens: MAX,
        ..Default::default()
    };
    s.submit(&options).unwrap();
    let e = s.append("busy", TokenizeFlags::NONE).err().unwrap();
    assert_eq!(e.status(), Status::Busy);
    let (mut text, mut tokens) = (Vec::new(), Vec::new());
    let outcome = loop {
        let p = s.poll().unwrap();
        text.extend(p.text);
        tokens.extend(p.tokens);
        if let Some(outcome) = p.done {
            break outcome;
        }
        cache.step(5.0).unwrap();
    };
    assert_eq!(outcome.unwrap(), StopReason::MaxTokens);
    assert_eq!(tokens, expected.tokens);
    assert_eq!(String::from_utf8(text).unwrap(), expected.text);
    s.append(" more", TokenizeFlags::NONE).unwrap(); // takes calls again after done
}

#[test]
fn worker_runs_request_callbacks() {
    let cache = model().cache(&CacheOptions { n_ctx: 256, ..Default::default() }).unwrap();
    let mut s = cache.session().unwrap();
    let pieces = Arc::new(Mutex::new(String::new()));
    let (done_tx, done_rx) = mpsc::channel();
    let sink = pieces.clone();
    cache.start_worker().unwrap();
    s.submit_with(
        &RequestOptions {
            text: Some(CHAT_PROMPT),
            text_flags: TokenizeFlags::PARSE_SPECIAL,
            max_tokens: MAX,
            ..Default::default()
        },
        RequestCallbacks::new()
            .on_token(move |_, piece| {
                sink.lock().unwrap().push_str(piece);
                ControlFlow::Continue(())
            })
            .on_done(move |outcome| done_tx.send(outcome).unwrap()),
    )
    .unwrap();
    let outcome = done_rx.recv_timeout(Duration::from_secs(60)).expect("on_done was not called");
    cache.stop_worker().unwrap();
    assert_eq!(outcome.unwrap(), (StopReason::MaxTokens, MAX));
    assert!(!pieces.lock().unwrap().is_empty());
    assert!(s.poll().unwrap().done.is_some());
}

#[test]
fn panic_in_request_callback_resumes_at_poll() {
    let cache = model().cache(&CacheOptions { n_ctx: 256, ..Default::default() }).unwrap();
    let mut s = cache.session().unwrap();
    s.submit_with(
        &RequestOptions {
            text: Some(CHAT_PROMPT),
            text_flags: TokenizeFlags::PARSE_SPECIAL,
            max_tokens: MAX,
            ..Default::default()
        },
        RequestCallbacks::new().on_token(|_, _| panic!("from on_token")),
    )
    .unwrap();
    let stepped = AtomicBool::new(false);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
        if s.poll().unwrap().done.is_some() {
            return;
        }
        cache.step(0.0).unwrap();
        stepped.store(true, Ordering::Relaxed);
    }));
    assert!(stepped.load(Ordering::Relaxed));
    let payload = match caught {
        Err(payload) => payload,
        Ok(_) => panic!("the panic did not resume at poll"),
    };
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"from on_token"));
}

#[test]
fn submit_errors() {
    let mut s = cache().session().unwrap();
    let e = s.submit(&max(4)).err().unwrap(); // empty session, no prompt
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = s.poll().err().unwrap(); // nothing was ever submitted
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = s.generate(&max(4)).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    let e = s.append_tokens(&[10_000_000]).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
}

#[test]
fn saved_state_continues_identically() {
    let mut s = chat_session();
    s.generate(&max(4)).unwrap();
    let state = s.save_state(&StateOptions::default()).unwrap();
    let small = s.save_state(&StateOptions { kv: false, strategy: true }).unwrap();
    assert!(small.len() < state.len());
    let file = std::env::temp_dir().join(format!("kiln-rust-{}.state", std::process::id()));
    s.save_state_file(&file, &StateOptions::default()).unwrap();
    let expected = s.generate(&max(MAX)).unwrap().tokens;
    for which in 0..3 {
        let mut r = cache().session().unwrap();
        match which {
            0 => r.load_state(&state).unwrap(),
            1 => r.load_state(&small).unwrap(),
            _ => r.load_state_file(&file).unwrap(),
        }
        assert_eq!(r.generate(&max(MAX)).unwrap().tokens, expected, "restore {which}");
    }
    std::fs::remove_file(&file).unwrap();
    let mut r = cache().session().unwrap();
    let e = r.load_state(&state[..state.len() / 2]).err().unwrap();
    assert_eq!(e.status(), Status::Format);
    assert_eq!(r.n_tokens(), 0);
}

// The thread-safety contract, checked by the compiler.
#[allow(dead_code)]
fn send_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send_sync::<Cache>();
    send_sync::<Sampler>();
    send_sync::<GgufFile>();
    send_sync::<kiln::Canceller>();
    send::<kiln::Session>();
    send::<Strategy>();
}

#[test]
fn stream_yields_a_failed_request_once() {
    let mut s = cache().session().unwrap();
    let canceller = s.canceller();
    let options = RequestOptions {
        text: Some(CHAT_PROMPT),
        text_flags: TokenizeFlags::PARSE_SPECIAL,
        max_tokens: 8,
        ..Default::default()
    };
    let mut stream = s.stream(&options).unwrap();
    canceller.cancel(); // still queued: the request fails with Cancelled and keeps nothing
    let e = stream.next().unwrap().err().unwrap();
    assert_eq!(e.status(), Status::Cancelled);
    assert!(stream.next().is_none());
    assert_eq!(stream.stop_reason(), None);
    drop(stream);
    assert_eq!(s.n_tokens(), 0);
    s.append("ok", TokenizeFlags::NONE).unwrap();
}

#[test]
fn cache_backend_cpu_and_cuda_fallback() {
    let own = cache().backend();
    assert!(own.starts_with("cpu") && !own.contains("requested"), "{own}");
    let pinned =
        model().cache(&CacheOptions { n_ctx: 256, n_threads: 2, pin_threads: true, ..Default::default() });
    assert!(pinned.unwrap().backend().contains("workers pinned"));
    let options = CacheOptions { n_ctx: 256, backend: Backend::Cuda, cuda_device: 0, ..Default::default() };
    let c = model().cache(&options).unwrap();
    let chosen = c.backend();
    if chosen.starts_with("cpu") {
        // No CUDA module, driver or device here: the cache still runs, on the CPU, and says why.
        let (_, reason) = chosen.split_once("; cuda requested, running on the CPU: ").expect(&chosen);
        assert!(!reason.trim().is_empty(), "{chosen}");
    } else {
        assert!(chosen.starts_with("cuda"), "{chosen}");
    }
    let mut s = c.session().unwrap();
    s.append("Hello", TokenizeFlags::NONE).unwrap();
    assert_eq!(s.generate(&max(2)).unwrap().tokens.len(), 2);
}

#[test]
fn cache_step_tokens() {
    let prompt = model()
        .tokenize(&"The quick brown fox jumps over the lazy dog. ".repeat(12), TokenizeFlags::NONE)
        .unwrap();
    assert!(prompt.len() > 100);
    // One step computes the whole prompt (under the 256-token chunk) by default, 48 tokens with
    // step_tokens 48. New caches: no prefix cache hit.
    for (step_tokens, expected) in [(CacheOptions::default().step_tokens, prompt.len() as i64), (48, 48)] {
        let c = model().cache(&CacheOptions { n_ctx: 256, step_tokens, ..Default::default() }).unwrap();
        let mut s = c.session().unwrap();
        s.submit(&RequestOptions { tokens: &prompt, max_tokens: 0, ..Default::default() }).unwrap();
        assert_eq!(c.step(0.0).unwrap().n_tokens, expected);
        while s.poll().unwrap().done.is_none() {
            c.step(0.0).unwrap();
        }
        assert_eq!(s.n_tokens(), prompt.len());
    }
    let e = model().cache(&CacheOptions { n_ctx: 256, step_tokens: 0, ..Default::default() }).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("step_tokens"), "{e}");
}

#[test]
fn mla_prefill_on_deepseek2() {
    // A prompt of more than 128 tokens in one chunk: measured runs it decompressed, whose logits
    // agree with the absorbed form's to float rounding but not bit for bit.
    let m = Model::load(fixture("tiny-deepseek2.gguf")).unwrap();
    assert_eq!(m.info().unwrap().architecture, "deepseek2");
    let prompt = m.tokenize(&"the quick brown fox jumps ".repeat(30), TokenizeFlags::NONE).unwrap();
    assert!(prompt.len() > 128);
    let logits = |mla_prefill| {
        let c = m.cache(&CacheOptions { n_threads: 2, mla_prefill, ..Default::default() }).unwrap();
        let mut s = c.session().unwrap();
        s.append_tokens(&prompt).unwrap();
        s.logits().unwrap()
    };
    let (absorbed, measured) = (logits(MlaPrefill::Absorbed), logits(MlaPrefill::Measured));
    assert_ne!(absorbed, measured, "measured ran the absorbed form (bitwise equal logits)");
    let scale = absorbed.iter().fold(0f32, |a, x| a.max(x.abs()));
    let diff = absorbed.iter().zip(&measured).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(diff <= 1e-3 * scale, "max difference {diff}, scale {scale}");
}

#[test]
fn eagle_strategy() {
    // An untrained head from kiln-mkeagle: greedy output is still plain decoding's (exact
    // verification), and it drafts.
    let head = fixture("SmolLM2-135M-Instruct.eagle.gguf");
    let expected = chat_session().generate(&max(MAX)).unwrap().tokens;
    let options = EagleOptions { top_k: 4, max_depth: 3, n_threads: 1, ..Default::default() };
    let eagle = Strategy::eagle(model(), &head, &options).unwrap();
    let mut s = chat_session();
    s.set_strategy(Some(eagle)).unwrap();
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, expected);
    let m = s.spec_metrics().unwrap();
    assert!(m.steps > 0 && m.drafted > 0 && m.accepted <= m.drafted, "{m:?}");
    assert!(EagleOptions::default().merge_ngram);
    // Without the n-gram candidates merged in: the head's tree alone, still exact.
    let alone =
        Strategy::eagle(model(), &head, &EagleOptions { merge_ngram: false, ..options.clone() }).unwrap();
    let mut s = chat_session();
    s.set_strategy(Some(alone)).unwrap();
    assert_eq!(s.generate(&max(MAX)).unwrap().tokens, expected);

    let e = Strategy::eagle(model(), &head, &EagleOptions { top_k: 65, ..options.clone() }).err().unwrap();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("top_k"), "{e}");
    let e = Strategy::eagle(model(), model_path(), &options).err().unwrap(); // a model, not a head
    assert_eq!(e.status(), Status::InvalidArgument);
}

#[test]
fn gguf_inspection() {
    let meta =
        |g: &GgufFile, key: &str| g.metadata().unwrap().into_iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let g = GgufFile::open(model_path()).unwrap();
    assert_eq!(meta(&g, "general.architecture").as_deref(), Some("\"llama\""));
    assert!(g.unsupported().is_empty(), "{:?}", g.unsupported());
    // An eagle head is a valid GGUF that kiln cannot run as a model: the problems are listed.
    let g = GgufFile::open(fixture("SmolLM2-135M-Instruct.eagle.gguf")).unwrap();
    assert_eq!(meta(&g, "general.architecture").as_deref(), Some("\"eagle\""));
    assert!(g.unsupported().first().map_or(false, |p| p.contains("eagle")), "{:?}", g.unsupported());
    let e = GgufFile::open("/nonexistent/missing.gguf").err().unwrap();
    assert_eq!(e.status(), Status::Io);
}
