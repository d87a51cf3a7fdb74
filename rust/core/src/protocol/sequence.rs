//! Per-channel sequence numbers (SeaTunnel's "channel data id"): a
//! channel numbers its records 1, 2, …; a receiver remembers the last one
//! it took and recognises what a restarted sender replays. Pure arithmetic,
//! shared by the runtime's tasks and the failover simulator.

/// How much of a batch of `n` records numbered up to `end` a receiver that
/// took records up to `taken` has seen before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// All of it: a replay, dropped.
    All,
    /// Its first `k` records (0: none); the rest are new.
    Prefix(u64),
    /// Records `taken + 1 ..= first - 1` never arrived: a sender resumed
    /// past what it had sent (exactly-once would not hold).
    Gap { first: u64 },
}

/// Classifies a batch against a receiver's high-water mark.
pub fn seen(taken: u64, n: u64, end: u64) -> Seen {
    let first = end.saturating_sub(n) + 1;
    if end <= taken {
        Seen::All
    } else if first > taken + 1 {
        Seen::Gap { first }
    } else {
        Seen::Prefix(taken + 1 - first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_drops_what_it_took_and_keeps_the_rest() {
        assert_eq!(seen(0, 3, 3), Seen::Prefix(0));
        assert_eq!(seen(3, 3, 6), Seen::Prefix(0));
        assert_eq!(seen(6, 3, 6), Seen::All);
        assert_eq!(seen(10, 3, 6), Seen::All);
        assert_eq!(seen(4, 3, 6), Seen::Prefix(1));
        assert_eq!(seen(5, 3, 6), Seen::Prefix(2));
        assert_eq!(seen(2, 3, 6), Seen::Gap { first: 4 });
    }

    proptest::proptest! {
        /// A sender that restarts from any earlier position and re-sends the
        /// same records in batches of any size: the receiver keeps every
        /// record exactly once, in order.
        #[test]
        fn replays_from_any_position_deliver_each_record_once(
            total in 1u64..200,
            cut in 0u64..200,
            resume in 0u64..200,
            sizes in proptest::collection::vec(1u64..17, 1..40),
        ) {
            let cut = cut.min(total);
            let resume = resume.min(cut);
            let mut taken = 0;
            let mut kept = Vec::new();
            let feed = |from: u64, upto: u64, taken: &mut u64, kept: &mut Vec<u64>| {
                let mut pos = from;
                let mut k = 0;
                while pos < upto {
                    let n = sizes[k % sizes.len()].min(upto - pos);
                    k += 1;
                    let end = pos + n;
                    match seen(*taken, n, end) {
                        Seen::All => {}
                        Seen::Prefix(skip) => kept.extend(pos + 1 + skip..=end),
                        Seen::Gap { .. } => panic!("gap"),
                    }
                    *taken = (*taken).max(end);
                    pos = end;
                }
            };
            feed(0, cut, &mut taken, &mut kept);
            feed(resume, total, &mut taken, &mut kept);
            proptest::prop_assert_eq!(kept, (1..=total).collect::<Vec<_>>());
        }
    }
}
