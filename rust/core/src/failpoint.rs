//! Crash points for the chaos harness (`snapcut chaos`).
//!
//! A random-time SIGKILL rarely lands inside the few microseconds of a
//! manifest rename or a sink commit, yet those are the windows where
//! exactly-once is won or lost. Code on such a window calls
//! [`hit`]`("store.before_manifest")`; when the environment variable
//! [`ENV`] arms that point, the process kills itself with SIGKILL on the
//! n-th hit (counted over all threads), exactly as an external `kill -9`.
//!
//! ```text
//! SNAPCUT_FAILPOINTS="store.before_manifest=3"            # die on the 3rd hit
//! SNAPCUT_FAILPOINTS="sink.mid_commit=1,store.after_manifest=2"
//! ```
//!
//! The variable is read once (into a `OnceLock`): unset, a hit costs one
//! atomic load. A malformed value or an unknown point name is a typo that
//! would silently disarm the test, so it stops the process with a message
//! naming the problem and exit code 2.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// The environment variable that arms crash points.
pub const ENV: &str = "SNAPCUT_FAILPOINTS";

/// Every crash point the code calls, and the window it sits in.
pub const POINTS: &[(&str, &str)] = &[
    (
        "store.after_state_file",
        "a checkpoint file (state, channel log) was written, the manifest not yet",
    ),
    (
        "store.before_manifest",
        "every checkpoint file is on disk, the manifest is not",
    ),
    (
        "store.after_manifest",
        "the manifest is committed, sinks have not been told to commit",
    ),
    (
        "retention.held_record",
        "retention wrote a held record beside a manifest it has not removed yet",
    ),
    (
        "retention.mid_hold",
        "retention removed a held checkpoint's manifest, not yet its unread files",
    ),
    (
        "sink.before_commit_rename",
        "the checkpoint is complete, the sink has not renamed its pending files",
    ),
    (
        "sink.mid_commit",
        "the sink renamed some of its pending files, not all",
    ),
    (
        "restore.after_load",
        "a checkpoint was read back for a restore, no task has started from it",
    ),
    (
        "sink.during_restore",
        "a restoring sink published some of the files its checkpoint staged, not all",
    ),
    (
        "compaction.sorted_copy",
        "the compactor sorted an input stored in capture order into a scratch file under compacting/, not yet mapped back",
    ),
    (
        "compaction.before_rename",
        "the compactor wrote a merged run under compacting/, not yet renamed",
    ),
    (
        "compaction.adopted",
        "a commit moved a merged run into its checkpoint directory, the manifest naming it is not written",
    ),
    (
        "spill.after_run",
        "a state table over its memory budget wrote a spilled run, not yet mapped back",
    ),
    (
        "spill.merged",
        "a state table merged its spilled runs into one, the old ones not yet removed",
    ),
];

/// One armed point: crash on hit number `nth` (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Armed {
    pub name: String,
    pub nth: u64,
}

/// Parses `name=N[,name=N...]` (commas or semicolons, spaces ignored).
/// Names must be in [`POINTS`]; N is a positive integer.
pub fn parse(spec: &str) -> Result<Vec<Armed>> {
    let mut out: Vec<Armed> = Vec::new();
    for part in spec
        .split([',', ';'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (name, nth) = part.split_once('=').ok_or_else(|| {
            Error::Config(format!(
                "{ENV}: '{part}' needs the form name=N (crash on the N-th hit), e.g. store.before_manifest=1"
            ))
        })?;
        let (name, nth) = (name.trim(), nth.trim());
        if !POINTS.iter().any(|(p, _)| *p == name) {
            let known: Vec<&str> = POINTS.iter().map(|(p, _)| *p).collect();
            return Err(Error::Config(format!(
                "{ENV}: unknown crash point '{name}'; known points: {}",
                known.join(", ")
            )));
        }
        let nth: u64 = match nth.parse() {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(Error::Config(format!(
                    "{ENV}: '{part}': the hit number must be an integer >= 1, got '{nth}'"
                )))
            }
        };
        if out.iter().any(|a| a.name == name) {
            return Err(Error::Config(format!(
                "{ENV}: crash point '{name}' is armed twice; give it once"
            )));
        }
        out.push(Armed {
            name: name.into(),
            nth,
        });
    }
    Ok(out)
}

struct Point {
    armed: Armed,
    hits: AtomicU64,
}

static ARMED: OnceLock<Vec<Point>> = OnceLock::new();

fn armed() -> &'static [Point] {
    ARMED.get_or_init(|| {
        let Ok(spec) = std::env::var(ENV) else {
            return Vec::new();
        };
        match parse(&spec) {
            Ok(points) => points
                .into_iter()
                .map(|armed| Point {
                    armed,
                    hits: AtomicU64::new(0),
                })
                .collect(),
            Err(e) => {
                eprintln!("snapcut: {e}");
                std::process::exit(2);
            }
        }
    })
}

/// A point armed from inside the process for a while ([`arm_scoped`]): a
/// Spark task arms `spill.after_run` for itself alone, where the
/// environment would arm every task a reused Python worker runs.
struct Scoped {
    point: Point,
    /// A line appended (and fsynced) to a file before the kill: the crash
    /// log of the caller's harness, in its own format.
    note: Option<(PathBuf, String)>,
}

static SCOPED_ON: AtomicBool = AtomicBool::new(false);

static SCOPED: Mutex<Vec<Scoped>> = Mutex::new(Vec::new());

fn scoped() -> std::sync::MutexGuard<'static, Vec<Scoped>> {
    // A panic while holding the lock leaves only counters behind: still usable.
    SCOPED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Arms `name` in this process until [`disarm_scoped`]: the process
/// crashes on its `nth` hit from now, after appending `note` (a file and a
/// line) if given. Arming a point again restarts its count.
pub fn arm_scoped(name: &str, nth: u64, note: Option<(PathBuf, String)>) -> Result<()> {
    let armed = parse(&format!("{name}={nth}"))?
        .pop()
        .ok_or_else(|| Error::Config(format!("{ENV}: no crash point in '{name}'")))?;
    let mut points = scoped();
    points.retain(|s| s.point.armed.name != armed.name);
    points.push(Scoped {
        point: Point {
            armed,
            hits: AtomicU64::new(0),
        },
        note,
    });
    SCOPED_ON.store(true, Ordering::SeqCst);
    Ok(())
}

/// Disarms every point [`arm_scoped`] armed.
pub fn disarm_scoped() {
    let mut points = scoped();
    points.clear();
    SCOPED_ON.store(false, Ordering::SeqCst);
}

fn hit_scoped(name: &str) {
    let points = scoped();
    for s in points.iter().filter(|s| s.point.armed.name == name) {
        let n = s.point.hits.fetch_add(1, Ordering::SeqCst) + 1;
        if n == s.point.armed.nth {
            if let Some((path, line)) = &s.note {
                append_note(path, line);
            }
            crash(name, n);
        }
    }
}

fn append_note(path: &PathBuf, line: &str) {
    // One short O_APPEND write, as the harness's own log lines.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| {
            f.write_all(format!("{line}\n").as_bytes())?;
            f.sync_all()
        });
    if let Err(e) = written {
        eprintln!(
            "snapcut: could not note the crash in {}: {e}",
            path.display()
        );
    }
}

/// Marks that execution reached crash point `name`; kills the process if
/// the point is armed and this is its n-th hit.
#[inline]
pub fn hit(name: &str) {
    if SCOPED_ON.load(Ordering::Relaxed) {
        hit_scoped(name);
    }
    let points = armed();
    if points.is_empty() {
        return;
    }
    debug_assert!(
        POINTS.iter().any(|(p, _)| *p == name),
        "crash point {name} is missing from failpoint::POINTS"
    );
    for p in points.iter().filter(|p| p.armed.name == name) {
        let n = p.hits.fetch_add(1, Ordering::SeqCst) + 1;
        if n == p.armed.nth {
            crash(name, n);
        }
    }
}

fn crash(name: &str, n: u64) -> ! {
    // The harness reads this line to tell failpoint kills from timer kills.
    eprintln!("snapcut: failpoint {name} hit {n}: killing the process (SIGKILL)");
    #[cfg(target_os = "linux")]
    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armed(name: &str, nth: u64) -> Armed {
        Armed {
            name: name.into(),
            nth,
        }
    }

    #[test]
    fn parses_one_and_many() {
        assert_eq!(
            parse("store.before_manifest=3").unwrap(),
            vec![armed("store.before_manifest", 3)]
        );
        assert_eq!(
            parse(" sink.mid_commit = 1 ; store.after_manifest=2,").unwrap(),
            vec![
                armed("sink.mid_commit", 1),
                armed("store.after_manifest", 2)
            ]
        );
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn rejects_bad_specs_naming_the_problem() {
        let msg = |s: &str| parse(s).unwrap_err().to_string();
        assert!(msg("store.before_manifest").contains("name=N"));
        assert!(
            msg("store.befor_manifest=1").contains("unknown crash point 'store.befor_manifest'")
        );
        assert!(msg("store.before_manifest=0").contains(">= 1"));
        assert!(msg("store.before_manifest=x").contains(">= 1"));
        assert!(msg("store.before_manifest=-1").contains(">= 1"));
        assert!(msg("sink.mid_commit=1,sink.mid_commit=2").contains("armed twice"));
    }

    #[test]
    fn every_point_has_a_description() {
        for (name, why) in POINTS {
            assert!(name.contains('.') && !why.is_empty());
        }
    }

    #[test]
    fn scoped_arming_checks_the_name_and_disarms() {
        let err = arm_scoped("spill.afterrun", 1, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown crash point 'spill.afterrun'"),
            "{err}"
        );
        assert!(arm_scoped("spill.after_run", 0, None)
            .unwrap_err()
            .to_string()
            .contains(">= 1"));
        // Armed for a hit no test reaches (other tests of this binary may
        // hit the point meanwhile: counts only grow, and never crash).
        arm_scoped("spill.merged", u64::MAX, None).unwrap();
        hit("spill.merged");
        hit("spill.merged");
        let before = scoped()[0].point.hits.load(Ordering::SeqCst);
        assert!(before >= 2);
        // Armed again: the count restarts.
        arm_scoped("spill.merged", u64::MAX, None).unwrap();
        assert!(scoped()[0].point.hits.load(Ordering::SeqCst) < before);
        disarm_scoped();
        hit("spill.merged");
        assert!(scoped().is_empty() && !SCOPED_ON.load(Ordering::SeqCst));
    }

    #[test]
    fn unarmed_hits_are_no_ops() {
        // The test process has no SNAPCUT_FAILPOINTS: a hit must return.
        if std::env::var(ENV).is_err() {
            hit("store.before_manifest");
        }
    }
}
