//! Planning an export of a checkpoint (`snapcut snapshots export`): which
//! file becomes which part of which table.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::snapshot::TaskId;
use crate::store::manifest::{FileRole, Manifest};

/// One part of an export of a checkpoint (`snapcut snapshots export`): a
/// task's state, rebuilt, as part `index` (its subtask) of the table named
/// after its vertex; a file of a role the format leaves to its writer (the
/// Spark sink's `output`) as part `index` (its subtask, its `partition`, or
/// its rank) of the table named after the role (`<role>-<vertex>` when it
/// belongs to a vertex). Source offsets and channel logs are not exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportPart {
    pub table: String,
    pub role: String,
    pub index: u64,
    pub task: Option<TaskId>,
    /// Index of its file in the manifest's `files`.
    pub file: usize,
}

/// Every part an export of `manifest` writes, states first, then by table
/// and index; two files that would be one part, or a table of two roles,
/// are refused.
pub fn export_plan(manifest: &Manifest) -> Result<Vec<ExportPart>> {
    let mut parts = Vec::new();
    let mut ranks: BTreeMap<String, u64> = BTreeMap::new();
    for (file, f) in manifest.files.iter().enumerate() {
        let role = String::from(f.role.clone());
        match &f.role {
            FileRole::State => {
                let task = f.task().ok_or_else(|| {
                    Error::Snapshot(format!(
                        "cannot export: state file {} names no task",
                        f.path
                    ))
                })?;
                parts.push(ExportPart {
                    table: task.vertex.clone(),
                    role,
                    index: task.subtask as u64,
                    task: Some(task),
                    file,
                });
            }
            FileRole::Sources | FileRole::Channel => {}
            FileRole::Other(_) => {
                let table = match &f.vertex {
                    Some(vertex) => format!("{role}-{vertex}"),
                    None => role.clone(),
                };
                let rank = ranks.entry(table.clone()).or_default();
                let index = f
                    .subtask
                    .map(|s| s as u64)
                    .or_else(|| f.extra.get("partition").and_then(|p| p.as_u64()))
                    .unwrap_or(*rank);
                *rank += 1;
                parts.push(ExportPart {
                    table,
                    role,
                    index,
                    task: None,
                    file,
                });
            }
        }
    }
    let mut roles: BTreeMap<&str, &str> = BTreeMap::new();
    let mut seen: BTreeMap<(&str, u64), &str> = BTreeMap::new();
    for p in &parts {
        let role = *roles.entry(&p.table).or_insert(&p.role);
        if role != p.role {
            return Err(Error::Snapshot(format!(
                "cannot export: table '{}' would hold both {role} and {} files",
                p.table, p.role
            )));
        }
        let path = manifest.files[p.file].path.as_str();
        if let Some(other) = seen.insert((&p.table, p.index), path) {
            return Err(Error::Snapshot(format!(
                "cannot export: files {other} and {path} would both be part {} of table '{}'",
                p.index, p.table
            )));
        }
    }
    parts.sort_by(|a, b| {
        (a.role != "state", &a.table, a.index).cmp(&(b.role != "state", &b.table, b.index))
    });
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::format::testing::{manifest, NOTHING};
    use crate::store::format::{other_entry, sources_entry};

    #[test]
    fn an_export_plans_states_first_and_refuses_clashing_parts() {
        let mut m = manifest(2, false, &[&[2], &[1, 2]]);
        let partition = |p: u64| [("partition".to_string(), p.into())].into_iter().collect();
        m.files.insert(
            0,
            other_entry("part-00001.arrow", "output", NOTHING, partition(1)),
        );
        m.files.push(other_entry(
            "part-00000.arrow",
            "output",
            NOTHING,
            partition(0),
        ));
        m.files.push(sources_entry(NOTHING));
        let plan = export_plan(&m).unwrap();
        let got: Vec<(&str, u64, usize)> = plan
            .iter()
            .map(|p| (p.table.as_str(), p.index, p.file))
            .collect();
        assert_eq!(
            got,
            vec![("a", 0, 1), ("a", 1, 2), ("output", 0, 3), ("output", 1, 0)]
        );
        m.files
            .push(other_entry("again.arrow", "output", NOTHING, partition(0)));
        let err = export_plan(&m).unwrap_err().to_string();
        assert!(
            err.contains("would both be part 0 of table 'output'"),
            "{err}"
        );
        m.files.pop();
        m.files
            .push(other_entry("x.arrow", "a", NOTHING, partition(7)));
        let err = export_plan(&m).unwrap_err().to_string();
        assert!(
            err.contains("table 'a' would hold both state and a files"),
            "{err}"
        );
    }
}
