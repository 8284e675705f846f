//! Stable identities: nodes and jobs are named by UUID, never by hostname.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::CoreError;

/// A node's (or an edge client's) stable identity. Survives renames and
/// address changes; it is the common name of the node's certificate.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(Uuid);

impl NodeId {
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }
    pub const fn from_u128(v: u128) -> Self {
        Self(Uuid::from_u128(v))
    }
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
    /// The URI SAN carried by this identity's certificate.
    pub fn urn(&self) -> String {
        format!("urn:pair:node:{}", self.0.hyphenated())
    }
    /// The first eight hex digits: enough for humans in tables and logs.
    pub fn short(&self) -> String {
        let mut s = self.0.simple().to_string();
        s.truncate(8);
        s
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.0.hyphenated())
    }
}

impl FromStr for NodeId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim())
            .map(Self)
            .map_err(|source| CoreError::BadNodeId {
                input: s.to_owned(),
                source,
            })
    }
}

/// What a paired identity may do in the cluster. Nodes serve and route;
/// clients (edge SDK programs) only send requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Node,
    Client,
}

impl Role {
    /// Whether a peer with this role may be scheduled to run requests.
    pub fn serves(self) -> bool {
        matches!(self, Role::Node)
    }
}

/// One request's identity, as recorded in the Jobs view.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(Uuid);

impl JobId {
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }
    pub const fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({})", self.0.hyphenated())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_round_trips_through_text_and_json() {
        let id = NodeId::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);
        let text = id.to_string();
        assert_eq!(text.parse::<NodeId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<NodeId>(&json).unwrap(), id);
        assert_eq!(id.urn(), format!("urn:pair:node:{text}"));
        assert_eq!(id.short(), "12345678");
    }

    #[test]
    fn bad_node_id_names_the_input() {
        let err = "not-a-uuid".parse::<NodeId>().unwrap_err();
        assert!(matches!(err, CoreError::BadNodeId { ref input, .. } if input == "not-a-uuid"));
    }
}
