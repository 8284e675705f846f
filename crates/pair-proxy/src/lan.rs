//! The LAN face: opt-in (`--lan-face ADDR`), for the other devices of a
//! home or office that can only be given a base URL and an API key (a
//! phone app, Open WebUI on a NAS, a notebook on a colleague's laptop).
//! One port serves the Ollama, OpenAI and Anthropic APIs (the paths tell
//! them apart, as on a node's faces), every request with a key made by
//! `pair-node keys add` (`Authorization: Bearer` or `x-api-key`), and
//! nothing else: the node's own routes (`/_pair/...`, `/ui`, `/metrics`)
//! and the engine's model management are not there.
//!
//! What a loopback face resists, this face resists against clients that
//! are not the machine's own: a `Host` that is not this node's name or
//! address (DNS rebinding), a page from an origin not allowed
//! (`--allowed-origin`, with CORS preflight answered for the ones that
//! are), too many connections from one address, wrong keys tried again and
//! again (slowed down, as PIN guesses are), a key over its rate (429 with
//! `Retry-After`), and the bodies' stall timeout and budget every face has.
//! Refusals are in the client's own error shape.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderName, HeaderValue, Method, Response, StatusCode, header};
use pair_core::ApiFlavor;
use pair_http::Reply;
use pair_http::h1::Headers;
use pair_identity::keys::{
    AddrGroup, FailureGate, KeyRecord, KeyStore, RateLimiter, parse_presented,
};
use std::time::Instant;

use crate::error::json_error;
use crate::gate::FaceGate;
use crate::route::{self, CONTROL_PREFIX, RouteClass};

/// How to build the LAN face's rules.
#[derive(Clone, Debug)]
pub struct LanConfig {
    /// The keys it takes (held cluster-wide).
    pub keys: KeyStore,
    /// The `Host` values it answers: this node's names and addresses and
    /// `--allowed-host` names (loopback ones too).
    pub hosts: Vec<String>,
    /// Origins whose pages may call it (`--allowed-origin`), as
    /// `scheme://host[:port]`.
    pub origins: Vec<String>,
    /// Connections one client address may hold at once.
    pub per_address: usize,
}

/// Connections one address may hold at once, by default.
pub const DEFAULT_PER_ADDRESS: usize = 32;

/// The LAN face's rules and the state they keep.
#[derive(Debug)]
pub struct Lan {
    keys: KeyStore,
    gate: FaceGate,
    origins: Vec<String>,
    per_address: usize,
    limiter: Mutex<RateLimiter>,
    failures: Mutex<FailureGate>,
    /// Connections open per address (an IPv6 /64 counts as one).
    open: Mutex<HashMap<AddrGroup, usize>>,
}

/// An admitted request's key (and the CORS origin its answer carries),
/// or the answer the door gives instead.
#[derive(Debug)]
pub enum Admitted {
    Key(KeyRecord, Option<HeaderValue>),
    Answered(Box<Reply>),
}

/// One connection of an address, counted until dropped.
#[derive(Debug)]
pub struct AddressSlot {
    lan: Arc<Lan>,
    group: AddrGroup,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.lan.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.group) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.group);
            }
        }
    }
}

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

impl Admitted {
    fn answered(reply: Reply) -> Self {
        Admitted::Answered(Box::new(reply))
    }
}

impl Lan {
    pub fn new(cfg: LanConfig) -> Arc<Self> {
        Arc::new(Self {
            keys: cfg.keys,
            gate: FaceGate::new(&cfg.hosts),
            origins: cfg
                .origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            per_address: cfg.per_address.max(1),
            limiter: Mutex::new(RateLimiter::default()),
            failures: Mutex::new(FailureGate::default()),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection from `peer`; `None` when its address (an
    /// IPv6 /64 counts as one: a host is routinely given a whole /64)
    /// holds as many as it may.
    pub fn connect(self: &Arc<Self>, peer: SocketAddr) -> Option<AddressSlot> {
        let group = AddrGroup::from(peer.ip());
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(group).or_insert(0);
        if *n >= self.per_address {
            return None;
        }
        *n += 1;
        drop(open);
        Some(AddressSlot {
            lan: Arc::clone(self),
            group,
        })
    }

    /// The door's rules for one request from `peer`, in order: the page's
    /// origin, a CORS preflight, `Host`, the routes that are not here, the
    /// address's record of wrong keys, the key, the key's rate.
    pub fn admit(&self, peer: IpAddr, method: &Method, path: &str, headers: &Headers) -> Admitted {
        self.rules(peer, method, path, headers, true)
    }

    /// The same rules but the rate, on a request's head before its body is
    /// read: a client with no valid key holds none of the node's body
    /// budget. The answer to a refused head; `None` to read the body (and
    /// [`Lan::admit`] the whole request).
    pub fn screen(
        &self,
        peer: IpAddr,
        method: &Method,
        path: &str,
        headers: &Headers,
    ) -> Option<Reply> {
        match self.rules(peer, method, path, headers, false) {
            Admitted::Key(..) => None,
            Admitted::Answered(reply) => Some(*reply),
        }
    }

    fn rules(
        &self,
        peer: IpAddr,
        method: &Method,
        path: &str,
        headers: &Headers,
        rate: bool,
    ) -> Admitted {
        let flavor = flavor_of(method, path);
        let origin = headers.get(&header::ORIGIN);
        let cors = match origin {
            None => None,
            Some(o) => match self.allowed_origin(o) {
                Some(v) => Some(v),
                None => {
                    return Admitted::answered(refusal(
                        StatusCode::FORBIDDEN,
                        flavor,
                        "forbidden",
                        "pages from this origin may not call this node (start it with --allowed-origin ORIGIN to allow one)",
                    ));
                }
            },
        };
        if *method == Method::OPTIONS {
            return Admitted::answered(preflight(cors, headers));
        }
        if self
            .gate
            .check(path, headers.get(&header::HOST), None)
            .is_err()
        {
            return Admitted::answered(with_cors(
                refusal(
                    StatusCode::FORBIDDEN,
                    flavor,
                    "forbidden",
                    "this node's LAN face answers only requests addressed to this node's own names and addresses (--allowed-host NAME adds one)",
                ),
                cors,
            ));
        }
        if !served_here(method, path) {
            return Admitted::answered(with_cors(
                refusal(
                    StatusCode::NOT_FOUND,
                    flavor,
                    "not_found",
                    &format!(
                        "{method} {path} is not served on this node's LAN face: it serves the inference routes and model listings"
                    ),
                ),
                cors,
            ));
        }
        let now = Instant::now();
        let ip = peer.to_canonical();
        if let Err(wait) = self.failures().check(ip, now) {
            return Admitted::answered(with_cors(
                too_many(
                    flavor,
                    wait,
                    "too many requests with a wrong or missing API key from this address: slowed down",
                ),
                cors,
            ));
        }
        let presented = headers
            .get(&header::AUTHORIZATION)
            .or_else(|| headers.get(&X_API_KEY))
            .and_then(|v| std::str::from_utf8(v).ok());
        let key = presented.and_then(|p| self.keys.verify(p));
        let Some(key) = key else {
            self.failures().failed(ip, now);
            let why = match presented.map(parse_presented) {
                None => {
                    "this node's LAN face needs an API key (Authorization: Bearer KEY, or x-api-key: KEY); `pair-node keys add NAME` makes one"
                }
                Some(_) => "the API key is not valid here: unknown or revoked",
            };
            let mut reply = refusal(StatusCode::UNAUTHORIZED, flavor, "invalid_api_key", why);
            reply
                .extra
                .push((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
            return Admitted::answered(with_cors(reply, cors));
        };
        self.failures().succeeded(ip);
        if rate
            && let Some(rate) = key.rate_per_min
            && let Err(wait) = self
                .limiter
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .check(key.id, rate, now)
        {
            return Admitted::answered(with_cors(
                too_many(
                    flavor,
                    wait,
                    &format!(
                        "API key '{}' is over its rate of {rate} requests a minute",
                        key.name
                    ),
                ),
                cors,
            ));
        }
        Admitted::Key(key, cors)
    }

    /// The `Access-Control-Allow-Origin` value for an allowed origin.
    pub fn allowed_origin(&self, origin: &[u8]) -> Option<HeaderValue> {
        let o = std::str::from_utf8(origin).ok()?.trim();
        let lower = o.trim_end_matches('/').to_ascii_lowercase();
        self.origins
            .iter()
            .any(|a| *a == lower || a == "*")
            .then(|| HeaderValue::from_str(o).ok())
            .flatten()
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, FailureGate> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The API a path belongs to: Ollama's under `/api/`, Anthropic's and the
/// Responses API's where the route says, OpenAI's otherwise.
pub fn flavor_of(method: &Method, path: &str) -> ApiFlavor {
    route::classify(method, path)
        .flavor()
        .unwrap_or(if path.starts_with("/api/") {
            ApiFlavor::Ollama
        } else {
            ApiFlavor::OpenAi
        })
}

/// Inference and the model listings are served; the node's own routes,
/// the engine's model management and anything else are not.
fn served_here(method: &Method, path: &str) -> bool {
    if path.starts_with(CONTROL_PREFIX) {
        return false;
    }
    matches!(
        route::classify(method, path),
        RouteClass::Inference(_) | RouteClass::Listing(_) | RouteClass::NotServed(_)
    )
}

fn refusal(status: StatusCode, flavor: ApiFlavor, code: &str, message: &str) -> Reply {
    json_error(status, flavor, code, message, None).into()
}

fn too_many(flavor: ApiFlavor, wait: Duration, why: &str) -> Reply {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut reply = refusal(StatusCode::TOO_MANY_REQUESTS, flavor, "rate_limited", why);
    reply
        .extra
        .push((header::RETRY_AFTER, HeaderValue::from(secs.max(1))));
    reply
}

/// The headers an answer to an allowed origin's page carries.
pub fn with_cors(mut reply: Reply, origin: Option<HeaderValue>) -> Reply {
    if let Some(o) = origin {
        reply.extra.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, o));
        reply
            .extra
            .push((header::VARY, HeaderValue::from_static("Origin")));
        reply.extra.push((
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(pair_link::header::EXPOSED),
        ));
    }
    reply
}

/// A CORS preflight: allowed for an allowed origin (the methods and the
/// headers it asks for), refused otherwise. No key: browsers send none on
/// a preflight.
fn preflight(origin: Option<HeaderValue>, headers: &Headers) -> Reply {
    let Some(origin) = origin else {
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = StatusCode::FORBIDDEN;
        return resp.into();
    };
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    let asked = headers
        .get(&header::ACCESS_CONTROL_REQUEST_HEADERS)
        .and_then(|v| HeaderValue::from_bytes(v).ok())
        .unwrap_or_else(|| {
            HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version")
        });
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    resp.into()
}

/// A connection beyond its address's share: 503 in the path's shape is not
/// known yet (no request read), so OpenAI's, the most common.
pub fn too_many_connections() -> Response<Body> {
    let mut resp = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        ApiFlavor::OpenAi,
        "too_many_connections",
        "this address holds as many connections to the node's LAN face as it may; close some and retry",
        None,
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::NodeId;
    use pair_http::h1::Headers;

    fn lan(origins: &[&str]) -> (Arc<Lan>, String) {
        let keys = KeyStore::in_memory();
        let (_, secret) = keys
            .add(
                "phone",
                pair_identity::keys::KeyTerms {
                    models: vec!["llama*".into()],
                    rate_per_min: std::num::NonZeroU32::new(2),
                    ..pair_identity::keys::KeyTerms::default()
                },
                1,
                NodeId::from_u128(1),
                &mut rand::rng(),
            )
            .unwrap();
        let lan = Lan::new(LanConfig {
            keys,
            hosts: vec!["gpu-box.lan".into(), "192.168.1.20".into()],
            origins: origins.iter().map(|o| (*o).to_owned()).collect(),
            per_address: 2,
        });
        (lan, secret.expose().to_owned())
    }

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        let mut m = http::HeaderMap::new();
        for (k, v) in pairs {
            m.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        Headers::Map(m)
    }

    fn status(a: Admitted) -> u16 {
        match a {
            Admitted::Key(..) => 200,
            Admitted::Answered(r) => r.status.as_u16(),
        }
    }

    const PHONE: &str = "10.0.0.7";

    #[test]
    fn a_key_is_needed_and_taken_either_way() {
        let (lan, secret) = lan(&[]);
        let ip: IpAddr = PHONE.parse().unwrap();
        let post = |h: &[(&str, &str)]| {
            status(lan.admit(ip, &Method::POST, "/v1/chat/completions", &headers(h)))
        };
        assert_eq!(post(&[("host", "gpu-box.lan:1234")]), 401);
        assert_eq!(
            post(&[
                ("host", "gpu-box.lan:1234"),
                ("authorization", "Bearer pair-sk-nope")
            ]),
            401
        );
        let bearer = format!("Bearer {secret}");
        assert_eq!(
            post(&[("host", "gpu-box.lan:1234"), ("authorization", &bearer)]),
            200
        );
        assert_eq!(
            post(&[("host", "192.168.1.20"), ("x-api-key", &secret)]),
            200
        );
        // A rebinding Host.
        assert_eq!(
            post(&[("host", "evil.example"), ("x-api-key", &secret)]),
            403
        );
    }

    #[test]
    fn the_nodes_own_routes_are_not_on_the_lan_face() {
        let (lan, secret) = lan(&[]);
        let ip: IpAddr = PHONE.parse().unwrap();
        for (m, p) in [
            (Method::GET, "/_pair/status"),
            (Method::POST, "/_pair/invite"),
            (Method::GET, "/ui"),
            (Method::GET, "/metrics"),
            (Method::POST, "/api/pull"),
            (Method::DELETE, "/api/delete"),
        ] {
            let h = headers(&[("host", "gpu-box.lan"), ("x-api-key", &secret)]);
            assert_eq!(status(lan.admit(ip, &m, p, &h)), 404, "{m} {p}");
        }
        let h = headers(&[("host", "gpu-box.lan"), ("x-api-key", &secret)]);
        assert_eq!(status(lan.admit(ip, &Method::GET, "/api/tags", &h)), 200);
    }

    #[test]
    fn wrong_keys_from_one_address_are_slowed_down_and_rates_kept() {
        let (lan, secret) = lan(&[]);
        let ip: IpAddr = PHONE.parse().unwrap();
        let wrong = headers(&[("host", "gpu-box.lan"), ("x-api-key", "pair-sk-guess")]);
        let statuses: Vec<u16> = (0..7)
            .map(|_| status(lan.admit(ip, &Method::POST, "/api/chat", &wrong)))
            .collect();
        assert_eq!(&statuses[..5], [401; 5]);
        assert_eq!(statuses[6], 429, "{statuses:?}");
        // Another address is not slowed by it; the key's rate (2/min) holds.
        let other: IpAddr = "10.0.0.8".parse().unwrap();
        let good = headers(&[("host", "gpu-box.lan"), ("x-api-key", &secret)]);
        let s: Vec<u16> = (0..3)
            .map(|_| status(lan.admit(other, &Method::POST, "/api/chat", &good)))
            .collect();
        assert_eq!(s, [200, 200, 429]);
    }

    #[test]
    fn allowed_origins_get_cors_and_others_are_refused() {
        let (lan, secret) = lan(&["http://nas.lan:8080"]);
        let ip: IpAddr = PHONE.parse().unwrap();
        let pre = headers(&[
            ("host", "gpu-box.lan"),
            ("origin", "http://nas.lan:8080"),
            (
                "access-control-request-headers",
                "authorization, content-type",
            ),
        ]);
        match lan.admit(ip, &Method::OPTIONS, "/v1/chat/completions", &pre) {
            Admitted::Answered(r) => {
                assert_eq!(r.status, 204);
                let Headers::Map(h) = &r.headers else {
                    panic!()
                };
                assert_eq!(h["access-control-allow-origin"], "http://nas.lan:8080");
                assert_eq!(
                    h["access-control-allow-headers"],
                    "authorization, content-type"
                );
            }
            Admitted::Key(..) => panic!("a preflight is answered by the door"),
        }
        let other = headers(&[
            ("host", "gpu-box.lan"),
            ("origin", "http://evil.example"),
            ("x-api-key", &secret),
        ]);
        assert_eq!(
            status(lan.admit(ip, &Method::POST, "/api/chat", &other)),
            403
        );
        assert!(lan.allowed_origin(b"http://NAS.lan:8080").is_some());
    }

    #[test]
    fn one_address_holds_a_few_connections() {
        let (lan, _) = lan(&[]);
        let a: SocketAddr = "10.0.0.7:5000".parse().unwrap();
        let b: SocketAddr = "10.0.0.8:5000".parse().unwrap();
        let s1 = lan.connect(a).unwrap();
        let _s2 = lan.connect(a).unwrap();
        assert!(lan.connect(a).is_none());
        assert!(lan.connect(b).is_some());
        drop(s1);
        assert!(lan.connect(a).is_some());
        // One IPv6 /64 is one address, whatever its host part.
        let v6 = |host: &str| format!("[2001:db8:1:2::{host}]:5000").parse().unwrap();
        let _t1 = lan.connect(v6("1")).unwrap();
        let _t2 = lan.connect(v6("ff")).unwrap();
        assert!(lan.connect(v6("abcd")).is_none());
        assert!(
            lan.connect("[2001:db8:1:3::1]:5000".parse().unwrap())
                .is_some()
        );
    }
}
