//! Streams a chat answer from a GGUF model, then continues the conversation without blocking.
//!
//!     cargo run --example chat -- [MODEL.gguf] ["question"]
use std::ops::ControlFlow;

use kiln::{CacheOptions, ChatMessage, Model, RequestOptions, Sampler, SamplerOptions, TokenizeFlags};

fn main() -> Result<(), kiln::Error> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| {
        format!("{}/.cache/kiln/SmolLM2-135M-Instruct.Q4_1.gguf", std::env::var("HOME").unwrap_or_default())
    });
    let question = args.next().unwrap_or_else(|| "Name three fruits.".to_string());

    let mut shown = -1;
    let model = Model::load_with(&path, true, |p| {
        let quarter = (p * 4.0) as i32; // 0%, 25%, ... 100%
        if quarter != shown {
            shown = quarter;
            eprintln!("loading {:.0}%", p * 100.0);
        }
        ControlFlow::Continue(())
    })?;
    let prompt = model.apply_chat_template(&[ChatMessage::user(&question)], None, true)?;
    let cache = model.cache(&CacheOptions { n_ctx: 2048, ..Default::default() })?;
    let sampler = Sampler::new(&SamplerOptions { temperature: 0.7, seed: 42, ..Default::default() })?;
    let mut session = cache.session_with(&sampler)?;

    // Blocking: an iterator of text pieces.
    let options = RequestOptions {
        text: Some(&prompt),
        text_flags: TokenizeFlags::PARSE_SPECIAL,
        max_tokens: 64,
        stop: &["<|im_end|>"],
        ..Default::default()
    };
    let mut stream = session.stream(&options)?;
    for piece in stream.by_ref() {
        print!("{}", piece?);
    }
    println!("\n[{:?}, {} tokens]", stream.stop_reason(), stream.tokens().len());
    drop(stream);

    // Non-blocking: submit, then step the cache yourself (a game loop: one step per frame).
    let follow_up = model.apply_chat_template(&[ChatMessage::user("And one vegetable?")], None, true)?;
    let follow_up = format!("<|im_end|>\n{follow_up}");
    session.submit(&RequestOptions { text: Some(&follow_up), max_tokens: 32, ..options })?;
    let mut text = Vec::new();
    loop {
        let polled = session.poll()?;
        text.extend(polled.text);
        if let Some(outcome) = polled.done {
            println!("{}\n[{:?}]", String::from_utf8_lossy(&text), outcome?);
            return Ok(());
        }
        cache.step(16.0)?;
    }
}
