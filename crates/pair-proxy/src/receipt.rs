//! The route receipt every routed answer carries: which node served it,
//! after how many attempts, under which policy, as which job, and (when
//! the client asked) why.

use http::header::HeaderValue;
use pair_core::JobId;
use pair_http::Extra;
use pair_link::header::{
    ATTEMPTS_HEADER, JOB_HEADER, MODEL_HEADER, NODE_HEADER, POLICY_HEADER, ROUTE_HEADER,
};

/// The route receipt: `x-pair-node`, `x-pair-attempts`, `x-pair-policy`,
/// `x-pair-job`, `x-pair-route` when the client asked why, and
/// `x-pair-model` when an alias chose the model.
#[derive(Debug)]
pub struct Receipt {
    /// `name (uuid)` of the node that served it.
    pub node: Option<HeaderValue>,
    pub attempts: usize,
    pub policy: &'static str,
    pub job: JobId,
    /// The scheduler's reasoning, when the client asked for it.
    pub why: Option<HeaderValue>,
    /// The model that answered, when an alias chose it.
    pub model: Option<HeaderValue>,
}

impl Receipt {
    /// The receipt as the fields an answer carries (in place of any of the
    /// answer's own of these names).
    pub fn into_extra(self) -> Extra {
        let mut extra = Extra::new();
        if let Some(v) = self.node {
            extra.push((NODE_HEADER, v));
        }
        extra.push((ATTEMPTS_HEADER, attempts_value(self.attempts)));
        extra.push((POLICY_HEADER, HeaderValue::from_static(self.policy)));
        if let Some(v) = self.why {
            extra.push((ROUTE_HEADER, v));
        }
        if let Some(v) = self.model {
            extra.push((MODEL_HEADER, v));
        }
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        if let Ok(v) = HeaderValue::from_str(self.job.as_uuid().hyphenated().encode_lower(&mut buf))
        {
            extra.push((JOB_HEADER, v));
        }
        extra
    }
}

/// `x-pair-attempts`: static for the usual counts (`HeaderValue::from`
/// allocates twice).
pub fn attempts_value(n: usize) -> HeaderValue {
    match n {
        1 => HeaderValue::from_static("1"),
        2 => HeaderValue::from_static("2"),
        3 => HeaderValue::from_static("3"),
        n => HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receipt_names_node_attempts_policy_job_and_why() {
        let r = Receipt {
            node: Some(HeaderValue::from_static(
                "a (00000000-0000-0000-0000-000000000001)",
            )),
            attempts: 2,
            policy: "predicted-latency",
            job: JobId::from_uuid(uuid::Uuid::from_u128(7)),
            why: Some(HeaderValue::from_static("score 1.5 (local)")),
            model: Some(HeaderValue::from_static("qwen2.5:7b")),
        };
        let extra = r.into_extra();
        let get = |n: &str| {
            extra
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, v)| v.to_str().unwrap().to_owned())
        };
        assert_eq!(get("x-pair-attempts").as_deref(), Some("2"));
        assert_eq!(get("x-pair-policy").as_deref(), Some("predicted-latency"));
        assert_eq!(
            get("x-pair-job").as_deref(),
            Some("00000000-0000-0000-0000-000000000007")
        );
        assert_eq!(get("x-pair-route").as_deref(), Some("score 1.5 (local)"));
        assert_eq!(get("x-pair-model").as_deref(), Some("qwen2.5:7b"));
        assert_eq!(attempts_value(12), "12");
    }
}
