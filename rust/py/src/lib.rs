//! `snapcut._core`: thin PyO3 bindings over snapcut-core. No logic lives here:
//! conversions, GIL release around Rust work, and error mapping only.

use pyo3::prelude::*;
use snapcut_core::protocol::ProtocolKind;

mod aggregate;
mod channel;
mod dataflow;
mod errors;
mod format;
mod pyjson;
mod sim;
mod state;
mod store;

use errors::IntoPyResult;

// Task threads allocate and free batches and checkpoint captures of similar
// sizes all the time, often on another thread than the one that allocated;
// glibc's malloc spent 2-6 % of a job's CPU on that (`malloc_consolidate`,
// `unlink_chunk`), more with checkpoints on. Built without transparent huge
// pages (`no_thp`): with them, a fresh page costs clearing 2 MiB, and the
// kernel's `clear_page_erms` took 3-6 % of a job's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Validates a protocol name and returns its canonical spelling.
#[pyfunction]
fn protocol_name(name: &str) -> PyResult<&'static str> {
    name.parse::<ProtocolKind>()
        .map(ProtocolKind::name)
        .map_py()
}

/// Arms a Rust crash point (`snapcut_core::failpoint::POINTS`) in this
/// process until `disarm_failpoints()`: SIGKILL on its `nth` hit from now,
/// after appending `note` (a line) to `note_path` if given.
#[pyfunction]
#[pyo3(signature = (name, nth=1, note_path=None, note=None))]
fn arm_failpoint(
    name: &str,
    nth: u64,
    note_path: Option<std::path::PathBuf>,
    note: Option<String>,
) -> PyResult<()> {
    let note = match (note_path, note) {
        (Some(path), Some(line)) => Some((path, line)),
        (None, None) => None,
        _ => {
            return Err(errors::to_py(snapcut_core::Error::Config(
                "arm_failpoint: give note_path and note together, or neither".into(),
            )))
        }
    };
    snapcut_core::failpoint::arm_scoped(name, nth, note).map_py()
}

/// Disarms every crash point `arm_failpoint` armed.
#[pyfunction]
fn disarm_failpoints() {
    snapcut_core::failpoint::disarm_scoped();
}

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h` enum, the same in
/// v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps freed pages before handing them back to the OS,
/// in ms, unless `MIMALLOC_PURGE_DELAY` says otherwise: mimalloc v3's own
/// default (v2, which this build uses, purges after 10 ms). A checkpoint
/// frees its captures (hundreds of MB at 10M keys) about a second before
/// the next one allocates as much again; purged, every page of it faults
/// back in, and on a guest that reports free pages to its host (virtio
/// balloon) a page unused for ~2 s costs a host fault too: at 10M keys
/// the task threads spent ~2 s more CPU a run, most of it in the kernel
/// (bench/results/state_store/direct_io/). A budgeted table still gives
/// its memory back at once after a flush (`heap::release_freed`).
const PURGE_DELAY_MS: std::os::raw::c_long = 1000;

fn keep_freed_pages_a_while() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option mimalloc reads on each purge decision.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// How long (ms) the allocator keeps freed pages before it hands them
/// back: what `keep_freed_pages_a_while` set, or `MIMALLOC_PURGE_DELAY`.
/// Read through the same option index that is set, so a test seeing the
/// environment's value here shows that index is mimalloc's `purge_delay`.
#[pyfunction]
fn _allocator_purge_delay_ms() -> std::os::raw::c_long {
    // SAFETY: reads an option; mimalloc initialises options on first use.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
}

/// The extension module `snapcut._core`.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // A flush frees a memtable as large as its budget: mimalloc returns
    // freed pages only after a delay, on a later call, so they would stay
    // counted in the worker's resident memory.
    // SAFETY: mi_collect only frees what the allocator no longer uses.
    snapcut_core::heap::set_release(|| unsafe { libmimalloc_sys::mi_collect(true) });
    keep_freed_pages_a_while();
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(protocol_name, m)?)?;
    m.add_function(wrap_pyfunction!(arm_failpoint, m)?)?;
    m.add_function(wrap_pyfunction!(disarm_failpoints, m)?)?;
    m.add_function(wrap_pyfunction!(_allocator_purge_delay_ms, m)?)?;
    channel::register(m)?;
    sim::register(m)?;
    dataflow::register(m)?;
    state::register(m)?;
    aggregate::register(m)?;
    store::register(m)?;
    format::register(m)?;
    Ok(())
}
