//! Route classification: which requests are routed across the cluster, which
//! are listings merged across it, and which pass through to the local engine.

use pair_core::ApiFlavor;

/// What kind of work an inference route asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Text generation (chat, completion, generate, messages).
    Generate,
    /// Embeddings: no output tokens, never streamed.
    Embed,
    /// Model metadata (`/api/show`): tiny, but only an owner can answer.
    Show,
}

/// Listings fanned out to every node and merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Listing {
    /// `GET /api/tags`: installed models, `{"models":[...]}`.
    OllamaTags,
    /// `GET /api/ps`: loaded models, `{"models":[...]}`.
    OllamaPs,
    /// `GET /v1/models`: `{"object":"list","data":[...]}`.
    OpenAiModels,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteClass {
    Inference {
        flavor: ApiFlavor,
        work: Work,
        /// The route's static name, for metrics and job records.
        route: &'static str,
    },
    Listing(Listing),
    /// Everything else goes to the local engine unchanged.
    Passthrough,
}

/// Every inference route's static name (the `route` of
/// [`RouteClass::Inference`]).
pub const INFERENCE_ROUTES: [&str; 9] = [
    "/api/generate",
    "/api/chat",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/messages",
];

/// Classifies a request by method and path (query string excluded).
pub fn classify(method: &http::Method, path: &str) -> RouteClass {
    use ApiFlavor::*;
    use Work::*;
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    if method == http::Method::POST {
        let (flavor, work, route) = match path {
            "/api/generate" => (Ollama, Generate, "/api/generate"),
            "/api/chat" => (Ollama, Generate, "/api/chat"),
            "/api/embed" => (Ollama, Embed, "/api/embed"),
            "/api/embeddings" => (Ollama, Embed, "/api/embeddings"),
            "/api/show" => (Ollama, Show, "/api/show"),
            "/v1/chat/completions" => (OpenAi, Generate, "/v1/chat/completions"),
            "/v1/completions" => (OpenAi, Generate, "/v1/completions"),
            "/v1/embeddings" => (OpenAi, Embed, "/v1/embeddings"),
            "/v1/messages" => (Anthropic, Generate, "/v1/messages"),
            _ => return RouteClass::Passthrough,
        };
        return RouteClass::Inference {
            flavor,
            work,
            route,
        };
    }
    if method == http::Method::GET {
        match path {
            "/api/tags" => return RouteClass::Listing(Listing::OllamaTags),
            "/api/ps" => return RouteClass::Listing(Listing::OllamaPs),
            "/v1/models" => return RouteClass::Listing(Listing::OpenAiModels),
            _ => {}
        }
    }
    RouteClass::Passthrough
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use proptest::strategy::Strategy;

    #[test]
    fn the_route_list_is_what_classify_names() {
        for r in INFERENCE_ROUTES {
            match classify(&Method::POST, r) {
                RouteClass::Inference { route, .. } => assert_eq!(route, r),
                other => panic!("{r}: {other:?}"),
            }
        }
    }

    proptest::proptest! {
        /// Metrics keep histograms for the listed routes only: classify
        /// names no other.
        #[test]
        fn every_inference_route_is_listed(
            path in proptest::prop_oneof![
                proptest::sample::select(INFERENCE_ROUTES.to_vec()).prop_map(str::to_owned),
                (proptest::sample::select(INFERENCE_ROUTES.to_vec()), "[a-z/]{0,3}")
                    .prop_map(|(r, tail)| format!("{r}{tail}")),
                "(/(api|v1)?)?(/[a-z/]{0,24})?/?",
            ]
        ) {
            if let RouteClass::Inference { route, .. } = classify(&Method::POST, &path) {
                proptest::prop_assert!(INFERENCE_ROUTES.contains(&route), "{}", route);
                proptest::prop_assert_eq!(route, path.strip_suffix('/').unwrap_or(&path));
            }
        }
    }

    #[test]
    fn inference_routes() {
        for (p, f) in [
            ("/api/generate", ApiFlavor::Ollama),
            ("/api/chat", ApiFlavor::Ollama),
            ("/api/embed", ApiFlavor::Ollama),
            ("/api/embeddings", ApiFlavor::Ollama),
            ("/v1/chat/completions", ApiFlavor::OpenAi),
            ("/v1/completions", ApiFlavor::OpenAi),
            ("/v1/embeddings", ApiFlavor::OpenAi),
            ("/v1/messages", ApiFlavor::Anthropic),
        ] {
            match classify(&Method::POST, p) {
                RouteClass::Inference { flavor, route, .. } => {
                    assert_eq!(flavor, f);
                    assert_eq!(route, p);
                }
                other => panic!("{p}: {other:?}"),
            }
        }
        assert!(matches!(
            classify(&Method::POST, "/api/chat/"),
            RouteClass::Inference { .. }
        ));
    }

    #[test]
    fn listings_and_passthrough() {
        assert_eq!(
            classify(&Method::GET, "/api/tags"),
            RouteClass::Listing(Listing::OllamaTags)
        );
        assert_eq!(
            classify(&Method::GET, "/v1/models"),
            RouteClass::Listing(Listing::OpenAiModels)
        );
        assert_eq!(classify(&Method::GET, "/api/chat"), RouteClass::Passthrough);
        assert_eq!(
            classify(&Method::POST, "/api/pull"),
            RouteClass::Passthrough
        );
        assert_eq!(
            classify(&Method::GET, "/api/version"),
            RouteClass::Passthrough
        );
        assert_eq!(
            classify(&Method::DELETE, "/api/delete"),
            RouteClass::Passthrough
        );
    }
}
