//! Fuzz target: route classification (`pair_proxy::route::classify`) on
//! arbitrary methods and paths. Never panics; only `POST` is routed and only
//! `GET` is merged; only Anthropic and Responses paths are refused in their
//! API's shape; one trailing slash never changes the class.
#![no_main]

use http::Method;
use libfuzzer_sys::fuzz_target;
use pair_proxy::route::{Listing, RouteClass, classify};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (method, path) = match selector % 8 {
        0 => (Method::GET, rest),
        1 => (Method::POST, rest),
        2 => (Method::HEAD, rest),
        3 => (Method::PUT, rest),
        4 => (Method::DELETE, rest),
        5 => (Method::OPTIONS, rest),
        6 => (Method::PATCH, rest),
        // An arbitrary extension method: `<token> <path>`.
        _ => {
            let split = rest.iter().position(|b| *b == b' ').unwrap_or(rest.len());
            let Ok(m) = Method::from_bytes(&rest[..split]) else {
                return;
            };
            (m, rest.get(split + 1..).unwrap_or_default())
        }
    };
    let path = String::from_utf8_lossy(path);
    let class = classify(&method, &path);
    match class {
        RouteClass::Inference(route) => {
            let route = route.path();
            assert_eq!(method, Method::POST);
            assert!(
                path == route || path.strip_suffix('/') == Some(route),
                "{path:?} routed as {route:?}"
            );
        }
        RouteClass::Listing(kind) => {
            assert_eq!(method, Method::GET);
            let expected = match kind {
                Listing::OllamaTags => "/api/tags",
                Listing::OllamaPs => "/api/ps",
                Listing::OpenAiModels => "/v1/models",
            };
            assert!(path == expected || path.strip_suffix('/') == Some(expected));
        }
        RouteClass::Node => {
            let p = path.strip_suffix('/').filter(|p| !p.is_empty()).unwrap_or(&path);
            assert!(
                p == "/metrics" || p == "/ui" || p.starts_with("/_pair/"),
                "{path:?} taken as the node's own route"
            );
        }
        RouteClass::NotServed(flavor) => {
            let p = path.strip_suffix('/').filter(|p| !p.is_empty()).unwrap_or(&path);
            let anthropic = p == "/v1/messages" || p.starts_with("/v1/messages/") || p == "/v1/complete";
            let expected = match flavor {
                pair_core::ApiFlavor::Anthropic => anthropic,
                pair_core::ApiFlavor::Responses => p.starts_with("/v1/responses"),
                _ => false,
            };
            assert!(expected, "{path:?} refused as {flavor:?}");
        }
        RouteClass::Passthrough => {}
    }
    if !path.ends_with('/') {
        let slashed = format!("{path}/");
        assert_eq!(classify(&method, &slashed), class, "trailing slash on {path:?}");
    }
});
