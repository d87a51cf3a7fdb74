//! XXH64 (seed 0), the hash of the runs' filters. The filters are written into
//! the format, so the hash must be the same everywhere, for ever: XXH64 is
//! specified (github.com/Cyan4973/xxHash, doc/xxhash_spec.md) and is the hash
//! Parquet's split-block bloom filters use, so a filter here is a Parquet one.
//! A key hashes as Parquet's plain encoding of it: an integer key as its 8
//! little-endian bytes (an `Int32` key widened to `i64` first), a byte or
//! string key as its bytes.

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

#[inline]
fn read_u64(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"))
}

#[inline]
fn read_u32(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

#[inline]
fn merge_round(acc: u64, value: u64) -> u64 {
    (acc ^ round(0, value)).wrapping_mul(P1).wrapping_add(P4)
}

/// XXH64 of `data` with `seed`.
pub fn xxh64(data: &[u8], seed: u64) -> u64 {
    let len = data.len();
    let mut at = 0;
    let mut h = if len >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while at + 32 <= len {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = round(*lane, read_u64(data, at + 8 * i));
            }
            at += 32;
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = merge_round(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len as u64);
    while at + 8 <= len {
        h ^= round(0, read_u64(data, at));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        at += 8;
    }
    if at + 4 <= len {
        h ^= u64::from(read_u32(data, at)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        at += 4;
    }
    for &byte in &data[at..] {
        h ^= u64::from(byte).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// The filter hash of an integer key.
#[inline]
pub fn hash_int(key: i64) -> u64 {
    xxh64(&key.to_le_bytes(), 0)
}

/// The filter hash of a byte or string key.
#[inline]
pub fn hash_bytes(key: &[u8]) -> u64 {
    xxh64(key, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values from the `xxhash` package (the C library's Python binding).
    #[test]
    fn matches_the_reference_implementation() {
        let hundred: Vec<u8> = (0..100).collect();
        let cases: [(&[u8], u64, u64); 6] = [
            (b"", 0, 0xef46_db37_51d8_e999),
            (b"a", 0, 0xd24e_c4f1_a98c_6e5b),
            (b"abc", 0, 0x44bc_2cf5_ad77_0999),
            (b"abc", 7, 0x9e75_5206_1566_76d7),
            (
                b"Nobody inspects the spammish repetition",
                0,
                0xfbce_a83c_8a37_8bf1,
            ),
            (&hundred, 0, 0x6ac1_e580_3216_6597),
        ];
        for (data, seed, want) in cases {
            assert_eq!(xxh64(data, seed), want, "{} bytes, seed {seed}", data.len());
        }
        assert_eq!(hash_int(42), 0xb556_806f_b6d1_4353);
        assert_eq!(hash_int(-1), 0x85d1_36ad_b773_c6c9);
    }
}
