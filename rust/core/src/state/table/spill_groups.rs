//! Groups of a spilling table (issue 37): a group's rows are its memtable
//! rows (the group index's slots) and, in each run, the key range that
//! begins with its prefix ([`crate::state::GroupPrefix`],
//! `RunSet::scan_prefixes`). A run's row counts unless the memtable holds
//! the key (its row is newer) or deleted it since the last flush (a shadow).

use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_select::interleave::interleave;

use super::{arrow_err, StateTable};
use crate::error::Result;

/// Where the rows of the asked groups are, each with its group's position
/// among those asked.
struct GroupRows {
    /// Memtable slots, grouped by position (`slot_groups` ascending).
    slots: Vec<u32>,
    slot_groups: Vec<u32>,
    /// (position, run, row): the runs' rows that count, grouped by position.
    runs: Vec<(u32, usize, u32)>,
}

impl StateTable {
    fn group_rows(&self, groups: &dyn Array) -> Result<GroupRows> {
        let index = self.group_index()?;
        let name = self.schema.field(index.col).name();
        let asked = index.key_type.keys(name, groups)?;
        let (slots, slot_groups) = index.slots_of(&asked);
        let prefix = index
            .prefix
            .expect("a spilling table with a group column has a group prefix");
        let spill = self.spill.as_ref().expect("a table with runs spills");
        let hits = spill
            .runs
            .scan_prefixes(prefix.prefixes(groups)?.as_ref())?;
        if hits.is_empty() {
            return Ok(GroupRows {
                slots,
                slot_groups,
                runs: hits,
            });
        }
        let keys = self.run_column(self.key_col, &hits)?;
        let in_memory = self.index.slots_of(keys.as_ref());
        let shadowed: Vec<bool> = if spill.shadows.len() == 0 {
            vec![false; hits.len()]
        } else {
            self.key_type
                .keys(self.key_column(), keys.as_ref())?
                .iter()
                .map(|k| spill.shadows.contains(k))
                .collect()
        };
        let runs = hits
            .into_iter()
            .enumerate()
            .filter(|&(i, _)| in_memory[i].is_none() && !shadowed[i])
            .map(|(_, hit)| hit)
            .collect();
        Ok(GroupRows {
            slots,
            slot_groups,
            runs,
        })
    }

    /// Column `col` of the runs' rows `hits` (their order).
    fn run_column(&self, col: usize, hits: &[(u32, usize, u32)]) -> Result<ArrayRef> {
        let spill = self.spill.as_ref().expect("a table with runs spills");
        let sources: Vec<&dyn Array> = spill
            .runs
            .iter()
            .map(|r| r.batch().column(col).as_ref())
            .collect();
        let picks: Vec<(usize, usize)> = hits
            .iter()
            .map(|&(_, run, row)| (run, row as usize))
            .collect();
        interleave(&sources, &picks).map_err(arrow_err)
    }

    /// `StateTable::lookup_groups` once runs hold part of the table: per
    /// group in the order asked, its memtable rows (in the order written),
    /// then its runs' rows (in key order).
    pub(super) fn lookup_groups_with_runs(
        &self,
        groups: &dyn Array,
    ) -> Result<(RecordBatch, UInt32Array)> {
        let found = self.group_rows(groups)?;
        let spill = self.spill.as_ref().expect("a table with runs spills");
        // Source 0: the memtable's rows (gathered in `slots` order); 1 + r: run r.
        let mut picks = Vec::with_capacity(found.slots.len() + found.runs.len());
        let mut which = Vec::with_capacity(picks.capacity());
        let (mut m, mut r) = (0, 0);
        while m < found.slots.len() || r < found.runs.len() {
            let memory_next = r == found.runs.len()
                || (m < found.slots.len() && found.slot_groups[m] <= found.runs[r].0);
            if memory_next {
                picks.push((0, m));
                which.push(found.slot_groups[m]);
                m += 1;
            } else {
                let (group, run, row) = found.runs[r];
                picks.push((1 + run, row as usize));
                which.push(group);
                r += 1;
            }
        }
        let mut arrays = Vec::with_capacity(self.columns.len());
        for (col, column) in self.columns.iter().enumerate() {
            let mine = column.gather(&found.slots);
            let mut sources: Vec<&dyn Array> = vec![mine.as_ref()];
            sources.extend(
                spill
                    .runs
                    .iter()
                    .map(|run| run.batch().column(col).as_ref()),
            );
            arrays.push(interleave(&sources, &picks).map_err(arrow_err)?);
        }
        let batch = RecordBatch::try_new(self.schema.clone(), arrays).map_err(arrow_err)?;
        spill.touched(groups.len() + found.runs.len());
        Ok((batch, UInt32Array::from(which)))
    }

    /// `StateTable::delete_groups` once runs hold part of the table: every
    /// live key of the groups, in memory or in the runs, is deleted.
    pub(super) fn delete_groups_with_runs(&mut self, groups: &dyn Array) -> Result<usize> {
        let found = self.group_rows(groups)?;
        let mine = self.columns[self.key_col].gather(&found.slots);
        let theirs = self.run_column(self.key_col, &found.runs)?;
        if mine.is_empty() && theirs.is_empty() {
            return Ok(0);
        }
        let keys =
            arrow_select::concat::concat(&[mine.as_ref(), theirs.as_ref()]).map_err(arrow_err)?;
        self.delete(keys.as_ref())
    }
}
