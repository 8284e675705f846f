//! Route classification: which requests are routed across the cluster, which
//! are listings merged across it, which are the node's own (metrics, the
//! control API, the Jobs view), and which pass through to the local engine;
//! and which API each face speaks.

use pair_core::{ApiFlavor, EngineKind};

/// Which API a face speaks natively (for its own errors and passthrough).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Face {
    /// Port 11434: the Ollama API, plus the OpenAI routes Ollama serves.
    Ollama,
    /// Port 1234: OpenAI / LM Studio.
    OpenAi,
}

impl Face {
    pub fn flavor(self) -> ApiFlavor {
        match self {
            Face::Ollama => ApiFlavor::Ollama,
            Face::OpenAi => ApiFlavor::OpenAi,
        }
    }

    /// Engines this face passes unclassified requests to, best first.
    pub fn passthrough_kinds(self) -> &'static [EngineKind] {
        match self {
            Face::Ollama => &[EngineKind::Ollama],
            Face::OpenAi => &[
                EngineKind::LmStudio,
                EngineKind::OpenAiCompat,
                EngineKind::Ollama,
            ],
        }
    }
}

pub use pair_link::{InferenceRoute, Work};

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
    /// A route served across the cluster: its API, kind of work and path
    /// are the route's.
    Inference(InferenceRoute),
    Listing(Listing),
    /// The node's own routes: `/metrics`, the control API (`/_pair/...`)
    /// and the Jobs view (`/ui`).
    Node,
    /// A path of an API pair translates that pair does not serve (Anthropic's
    /// batches, a stored response): a 404 in that API's shape, never the
    /// engine's (which knows nothing of the API).
    NotServed(ApiFlavor),
    /// Everything else goes to the local engine unchanged.
    Passthrough,
}

impl RouteClass {
    /// The API the path belongs to, where the path says (its errors are in
    /// that API's shape).
    pub fn flavor(self) -> Option<ApiFlavor> {
        match self {
            RouteClass::Inference(route) => Some(route.flavor()),
            RouteClass::NotServed(flavor) => Some(flavor),
            _ => None,
        }
    }
}

/// The prefix of the node's control API.
pub const CONTROL_PREFIX: &str = "/_pair/";

/// Every inference route's static name: the only names metrics and job
/// records carry (the paths of [`InferenceRoute::ALL`], in its order).
pub const INFERENCE_ROUTES: [&str; 11] = {
    let mut names = [""; 11];
    let mut i = 0;
    while i < InferenceRoute::ALL.len() {
        names[i] = InferenceRoute::ALL[i].path();
        i += 1;
    }
    names
};

/// Classifies a request by method and path (query string excluded).
pub fn classify(method: &http::Method, path: &str) -> RouteClass {
    let path = path
        .strip_suffix('/')
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    if method == http::Method::POST
        && let Some(route) = InferenceRoute::from_path(path)
    {
        return RouteClass::Inference(route);
    }
    if path == "/metrics" || path == "/ui" || path.starts_with(CONTROL_PREFIX) {
        return RouteClass::Node;
    }
    let messages = InferenceRoute::AnthropicMessages.path();
    if path == messages
        || path
            .strip_prefix(messages)
            .is_some_and(|rest| rest.starts_with('/'))
        || path == "/v1/complete"
    {
        return RouteClass::NotServed(ApiFlavor::Anthropic);
    }
    if path.starts_with(InferenceRoute::OpenAiResponses.path()) {
        return RouteClass::NotServed(ApiFlavor::Responses);
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

    #[test]
    fn the_route_list_is_what_classify_names() {
        for r in INFERENCE_ROUTES {
            match classify(&Method::POST, r) {
                RouteClass::Inference(route) => assert_eq!(route.path(), r),
                other => panic!("{r}: {other:?}"),
            }
        }
    }

    #[test]
    fn chat_routes_are_generation_routes_with_messages() {
        let chats: Vec<&str> = INFERENCE_ROUTES
            .into_iter()
            .filter(|r| InferenceRoute::from_path(r).is_some_and(InferenceRoute::is_chat))
            .collect();
        assert_eq!(chats, ["/api/chat", "/v1/chat/completions", "/v1/messages"]);
        for r in chats {
            assert!(matches!(
                classify(&http::Method::POST, r),
                RouteClass::Inference(route) if route.work() == Work::Generate
            ));
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
            ("/v1/messages/count_tokens", ApiFlavor::Anthropic),
            ("/v1/responses", ApiFlavor::Responses),
        ] {
            match classify(&Method::POST, p) {
                RouteClass::Inference(route) => {
                    assert_eq!(route.flavor(), f);
                    assert_eq!(route.path(), p);
                }
                other => panic!("{p}: {other:?}"),
            }
        }
        assert!(matches!(
            classify(&Method::POST, "/api/chat/"),
            RouteClass::Inference(_)
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
        for (m, p, f) in [
            (Method::POST, "/v1/messages/batches", ApiFlavor::Anthropic),
            (Method::GET, "/v1/messages", ApiFlavor::Anthropic),
            (Method::POST, "/v1/complete", ApiFlavor::Anthropic),
            (Method::GET, "/v1/responses/resp_1", ApiFlavor::Responses),
            (
                Method::POST,
                "/v1/responses/resp_1/cancel",
                ApiFlavor::Responses,
            ),
        ] {
            assert_eq!(classify(&m, p), RouteClass::NotServed(f), "{m} {p}");
        }
        for (m, p) in [
            (Method::GET, "/metrics"),
            (Method::GET, "/ui"),
            (Method::GET, "/_pair/status"),
            (Method::POST, "/_pair/invite"),
        ] {
            assert_eq!(classify(&m, p), RouteClass::Node, "{m} {p}");
        }
    }
}
