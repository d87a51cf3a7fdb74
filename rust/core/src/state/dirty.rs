//! The set of slots written since the last checkpoint, as a two-level bitmap.
//!
//! Marking is one bit store; listing visits only the non-empty 64-slot words
//! found through a summary bitmap (one bit per word), so it costs
//! O(changed + slots / 4096) and yields slots in ascending order — the order
//! in which gathering them from the columns is a forward sweep, not random.

#[derive(Debug, Default)]
pub(crate) struct DirtySet {
    words: Vec<u64>,
    summary: Vec<u64>,
    count: usize,
}

impl DirtySet {
    /// Makes room for slots `0..len`.
    pub(crate) fn grow(&mut self, len: usize) {
        let words = len.div_ceil(64);
        if words > self.words.len() {
            self.words.resize(words, 0);
            self.summary.resize(words.div_ceil(64), 0);
        }
    }

    pub(crate) fn insert(&mut self, slot: u32) {
        let (w, b) = (slot as usize / 64, slot % 64);
        let word = &mut self.words[w];
        if *word & (1 << b) == 0 {
            if *word == 0 {
                self.summary[w / 64] |= 1 << (w % 64);
            }
            *word |= 1 << b;
            self.count += 1;
        }
    }

    /// Number of slots marked.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Marked slots in ascending order.
    pub(crate) fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.count);
        for (si, &s) in self.summary.iter().enumerate() {
            let mut s = s;
            while s != 0 {
                let w = si * 64 + s.trailing_zeros() as usize;
                s &= s - 1;
                let mut word = self.words[w];
                while word != 0 {
                    out.push((w * 64) as u32 + word.trailing_zeros());
                    word &= word - 1;
                }
            }
        }
        out
    }

    /// Unmarks everything, touching only the non-empty words.
    pub(crate) fn clear(&mut self) {
        for si in 0..self.summary.len() {
            let mut s = std::mem::take(&mut self.summary[si]);
            while s != 0 {
                let w = si * 64 + s.trailing_zeros() as usize;
                s &= s - 1;
                self.words[w] = 0;
            }
        }
        self.count = 0;
    }

    /// Forgets every slot (the table was emptied).
    pub(crate) fn reset(&mut self) {
        self.words.clear();
        self.summary.clear();
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::DirtySet;

    #[test]
    fn lists_sorted_and_clears() {
        let mut d = DirtySet::default();
        d.grow(10_000);
        for s in [9999, 0, 64, 63, 4096, 64, 5000] {
            d.insert(s);
        }
        assert_eq!(d.len(), 6);
        assert_eq!(d.to_vec(), vec![0, 63, 64, 4096, 5000, 9999]);
        d.clear();
        assert_eq!(d.len(), 0);
        assert!(d.to_vec().is_empty());
        d.insert(7);
        assert_eq!(d.to_vec(), vec![7]);
    }
}
