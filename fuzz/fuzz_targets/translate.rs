//! Fuzz target: API translation (`pair_translate`). The first byte picks a
//! route and where to cut; the rest, split at its first NUL, is a client's
//! request body and an engine's event stream. A request translates or is
//! refused naming a field, never panics, and what it becomes is JSON; the
//! answer's stream translated in two pieces equals it translated whole,
//! and a whole answer of any bytes translates to JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_translate::{Route, Timing};

const ROUTES: [Route; 8] = [
    Route::OllamaChat,
    Route::OllamaGenerate,
    Route::OllamaEmbed,
    Route::OllamaEmbeddings,
    Route::OllamaShow,
    Route::AnthropicMessages,
    Route::AnthropicCountTokens,
    Route::OpenAiResponses,
];

fn stream(route: Route, req: &[u8], pieces: &[&[u8]]) -> Option<Vec<u8>> {
    let mut t = pair_translate::request(route, req, "2026-12-03T12:00:00Z").ok()?;
    let mut out = Vec::new();
    for p in pieces {
        t.answer.push(p, Timing::default(), &mut out);
    }
    t.answer.finish(Timing::default(), &mut out);
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let route = ROUTES[usize::from(pick) % ROUTES.len()];
    let (req, events) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    match pair_translate::request(route, req, "2026-12-03T12:00:00Z") {
        Err(e) => assert!(!e.field.is_empty(), "a refusal names its field"),
        Ok(t) => {
            if !t.body.is_empty() {
                serde_json::from_slice::<serde_json::Value>(&t.body).expect("a translated body is JSON");
            }
            let whole = t.answer.whole(200, events, Timing::default());
            let text = whole.strip_suffix(b"\n").unwrap_or(&whole);
            serde_json::from_slice::<serde_json::Value>(text).expect("a whole answer is JSON");
        }
    }
    let cut = usize::from(pick) * 7 % (events.len() + 1);
    let (a, b) = events.split_at(cut);
    assert_eq!(stream(route, req, &[a, b]), stream(route, req, &[events]), "split at {cut}");
});
