//! A split-block bloom filter, exactly Parquet's (parquet-format,
//! BloomFilter.md): 256-bit blocks of eight 32-bit words, a key's block chosen
//! by the hash's upper half, one bit per word set by the lower half times a
//! salt. One cache line per probe; ~1 % false positives at ~10 bits per key.
//! A run's filter answers "may this run hold the key?" before its key column
//! is searched; it never says no to a key the run holds.

use crate::error::{Error, Result};

const SALT: [u32; 8] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
];

/// Bytes per block.
pub const BLOCK_BYTES: usize = 32;

/// The largest filter [`BloomFilter::for_keys`] sizes (Parquet's bound).
pub const MAX_BYTES: usize = 128 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BloomFilter {
    blocks: Vec<[u32; 8]>,
}

impl BloomFilter {
    /// A filter for `keys` distinct keys at false-positive probability `fpp`,
    /// sized by Parquet's formula (bits = -8 n / ln(1 - fpp^(1/8))), rounded up
    /// to whole blocks, at least one block and at most [`MAX_BYTES`].
    pub fn for_keys(keys: usize, fpp: f64) -> Result<Self> {
        if !(fpp > 0.0 && fpp < 1.0) {
            return Err(Error::Config(format!(
                "a bloom filter's false-positive probability must be in (0, 1), got {fpp}"
            )));
        }
        let bits = -8.0 * keys as f64 / (1.0 - fpp.powf(1.0 / 8.0)).ln();
        let bytes = ((bits / 8.0).ceil() as usize).clamp(BLOCK_BYTES, MAX_BYTES);
        Ok(Self {
            blocks: vec![[0; 8]; bytes.div_ceil(BLOCK_BYTES)],
        })
    }

    /// The filter's size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES
    }

    #[inline]
    fn block(&self, hash: u64) -> usize {
        (((hash >> 32) * self.blocks.len() as u64) >> 32) as usize
    }

    #[inline]
    fn mask(hash: u64) -> [u32; 8] {
        let low = hash as u32;
        SALT.map(|salt| 1u32 << (low.wrapping_mul(salt) >> 27))
    }

    /// Adds a key, by its hash ([`super::hash`]).
    #[inline]
    pub fn insert(&mut self, hash: u64) {
        let at = self.block(hash);
        let block = &mut self.blocks[at];
        for (word, bit) in block.iter_mut().zip(Self::mask(hash)) {
            *word |= bit;
        }
    }

    /// False: the key was never inserted. True: it may have been.
    #[inline]
    pub fn may_contain(&self, hash: u64) -> bool {
        let block = &self.blocks[self.block(hash)];
        block
            .iter()
            .zip(Self::mask(hash))
            .all(|(word, bit)| word & bit != 0)
    }

    /// The filter as written: its words, little-endian, block after block
    /// (Parquet's bitset layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.blocks
            .iter()
            .flat_map(|block| block.iter().flat_map(|word| word.to_le_bytes()))
            .collect()
    }

    /// Reads [`Self::to_bytes`]'s output back; `what` names the file for the error.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Self> {
        if bytes.is_empty() || bytes.len() % BLOCK_BYTES != 0 || bytes.len() > MAX_BYTES {
            return Err(Error::Snapshot(format!(
                "{what}: a bloom filter of {} bytes is corrupt (want a positive multiple of \
                 {BLOCK_BYTES} up to {MAX_BYTES})",
                bytes.len()
            )));
        }
        let blocks = bytes
            .chunks_exact(BLOCK_BYTES)
            .map(|block| {
                let mut words = [0u32; 8];
                for (word, b) in words.iter_mut().zip(block.chunks_exact(4)) {
                    *word = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                }
                words
            })
            .collect();
        Ok(Self { blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::super::hash::{hash_bytes, hash_int};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holds_every_key_and_few_others() {
        let n = 100_000i64;
        let mut filter = BloomFilter::for_keys(n as usize, 0.01).unwrap();
        for k in 0..n {
            filter.insert(hash_int(k * 2));
        }
        assert!((0..n).all(|k| filter.may_contain(hash_int(k * 2))));
        let false_positives = (0..n)
            .filter(|k| filter.may_contain(hash_int(k * 2 + 1)))
            .count();
        let rate = false_positives as f64 / n as f64;
        assert!(rate < 0.02, "false-positive rate {rate}");
        assert!(rate > 0.0, "a 1 % filter that never errs is oversized");
        // ~9.7 bits per key at 1 %
        assert!(
            (110_000..=130_000).contains(&filter.len_bytes()),
            "{}",
            filter.len_bytes()
        );
    }

    #[test]
    fn an_empty_filter_holds_nothing_and_is_one_block() {
        let filter = BloomFilter::for_keys(0, 0.01).unwrap();
        assert_eq!(filter.len_bytes(), BLOCK_BYTES);
        assert!(!filter.may_contain(hash_bytes(b"k")));
    }

    #[test]
    fn bad_sizes_are_refused() {
        for fpp in [0.0, 1.0, -0.5, f64::NAN] {
            let err = BloomFilter::for_keys(10, fpp).unwrap_err();
            assert!(
                err.to_string().contains("false-positive probability"),
                "{err}"
            );
        }
        for len in [0, 31, 33] {
            let err = BloomFilter::from_bytes(&vec![0; len], "run-3.bloom").unwrap_err();
            assert!(
                err.to_string().contains("run-3.bloom: a bloom filter of"),
                "{err}"
            );
        }
    }

    /// One bit in each word of the key's block: Parquet's layout, checked on
    /// a key whose block and bits are worked out by hand.
    #[test]
    fn sets_one_bit_per_word_in_the_block_the_upper_hash_picks() {
        let mut filter = BloomFilter::from_bytes(&[0; 4 * BLOCK_BYTES], "t").unwrap();
        let hash = (3u64 << 62) | 1; // upper half 0xC000_0000 of 4 blocks -> block 3; lower half 1
        filter.insert(hash);
        let bytes = filter.to_bytes();
        assert!(bytes[..3 * BLOCK_BYTES].iter().all(|&b| b == 0));
        for (i, salt) in SALT.iter().enumerate() {
            let at = 3 * BLOCK_BYTES + 4 * i;
            let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            assert_eq!(word, 1 << (salt >> 27), "word {i}");
        }
    }

    proptest! {
        #[test]
        fn no_false_negatives_and_bytes_round_trip(
            keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..300),
            fpp in 0.001f64..0.5,
        ) {
            let mut filter = BloomFilter::for_keys(keys.len(), fpp).unwrap();
            for key in &keys {
                filter.insert(hash_bytes(key));
            }
            for key in &keys {
                prop_assert!(filter.may_contain(hash_bytes(key)));
            }
            let back = BloomFilter::from_bytes(&filter.to_bytes(), "t").unwrap();
            prop_assert_eq!(back, filter);
        }
    }
}
