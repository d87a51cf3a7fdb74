//! A stable fingerprint of a graph's shape, recorded in every checkpoint.

use super::{LogicalGraph, Partitioning, VertexKind};

/// `g1-` + FNV-1a 64 of a canonical description: vertex names, kinds and
/// parallelism, then edges with partitioning, feedback flag and port. The
/// same graph always gives the same string, on any machine and run.
pub(crate) fn fingerprint(g: &LogicalGraph) -> String {
    let mut canon = String::new();
    for v in &g.vertices {
        let kind = match v.kind {
            VertexKind::Source(_) => 'S',
            VertexKind::Operator(_) => 'O',
        };
        canon.push_str(&format!("v{}|{}|{};", v.name.len(), v.name, kind));
        canon.push_str(&format!("{};", v.parallelism));
    }
    for e in &g.edges {
        let part = match &e.partitioning {
            Partitioning::Forward => "forward".to_string(),
            Partitioning::Hash { key } => format!("hash{}|{}", key.len(), key),
            Partitioning::Broadcast => "broadcast".to_string(),
            Partitioning::RoundRobin => "round-robin".to_string(),
        };
        canon.push_str(&format!(
            "e{}>{}|{}|{}|{};",
            e.from, e.to, part, e.feedback as u8, e.port
        ));
    }
    format!("g1-{:016x}", fnv1a(canon.as_bytes()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
