//! `snapcut._core.channel(capacity)`: the core SPSC channel carrying Python objects
//! (by reference: a numpy array or Arrow batch arrives as the very same object).
//!
//! Every wait runs with the GIL released, in slices of `SLICE` so that Ctrl-C
//! (`check_signals`) and `close()` from another thread get a turn. Each end's mutex is
//! only ever locked with the GIL released, so a thread blocked on it never holds the
//! GIL that the peer thread may need.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use snapcut_core::channel::{
    self as core, RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError,
};
use snapcut_core::Error;

use crate::errors::IntoPyResult;

type Obj = Py<PyAny>;

const SLICE: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn closed<T>() -> PyResult<T> {
    Err(Error::Disconnected).map_py()
}

fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Instant::now().checked_add(Duration::from_secs_f64(t)))
        }
        Some(t) => Err(Error::Config(format!(
            "timeout must be a finite number of seconds >= 0 or None (got {t})"
        )))
        .map_py(),
    }
}

/// The end of the current wait slice, and whether it is the caller's deadline.
fn slice_end(deadline: Option<Instant>) -> (Instant, bool) {
    let step = Instant::now() + SLICE;
    match deadline {
        Some(d) if d <= step => (d, true),
        _ => (step, false),
    }
}

fn timed_out() -> PyErr {
    PyTimeoutError::new_err("channel operation timed out")
}

/// The sending end of a channel of Python objects.
#[pyclass(module = "snapcut._core", name = "Sender", frozen)]
pub struct PySender {
    inner: Mutex<Option<core::Sender<Obj>>>,
    capacity: usize,
}

/// The receiving end of a channel of Python objects.
#[pyclass(module = "snapcut._core", name = "Receiver", frozen)]
pub struct PyReceiver {
    inner: Mutex<Option<core::Receiver<Obj>>>,
    capacity: usize,
}

/// A bounded FIFO channel of Python objects with room for `capacity` of them.
#[pyfunction]
fn channel(capacity: usize) -> PyResult<(PySender, PyReceiver)> {
    let (tx, rx) = core::try_channel::<Obj>(capacity)
        .map_err(Error::from)
        .map_py()?;
    Ok((
        PySender {
            inner: Mutex::new(Some(tx)),
            capacity,
        },
        PyReceiver {
            inner: Mutex::new(Some(rx)),
            capacity,
        },
    ))
}

#[pymethods]
impl PySender {
    /// Sends `obj`, waiting while the channel is full (GIL released).
    #[pyo3(signature = (obj, timeout=None))]
    fn send(&self, py: Python<'_>, obj: Obj, timeout: Option<f64>) -> PyResult<()> {
        let deadline = deadline(timeout)?;
        let mut value = obj;
        loop {
            let (end, last) = slice_end(deadline);
            let r = py.detach(|| match lock(&self.inner).as_mut() {
                Some(tx) => tx.send_deadline(value, Some(end)),
                None => Err(SendTimeoutError::Disconnected(value)),
            });
            match r {
                Ok(()) => return Ok(()),
                Err(SendTimeoutError::Disconnected(_)) => return closed(),
                Err(SendTimeoutError::Timeout(v)) if last => {
                    drop(v);
                    return Err(timed_out());
                }
                Err(SendTimeoutError::Timeout(v)) => {
                    value = v;
                    py.check_signals()?;
                }
            }
        }
    }

    /// Sends `obj` if there is room; returns whether it was sent.
    fn try_send(&self, py: Python<'_>, obj: Obj) -> PyResult<bool> {
        let r = py.detach(|| match lock(&self.inner).as_mut() {
            Some(tx) => tx.try_send(obj),
            None => Err(TrySendError::Disconnected(obj)),
        });
        match r {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(_)) => Ok(false),
            Err(TrySendError::Disconnected(_)) => closed(),
        }
    }

    /// Sends every object of `objs` in order, publishing as many at once as fit.
    #[pyo3(signature = (objs, timeout=None))]
    fn send_many(
        &self,
        py: Python<'_>,
        objs: &Bound<'_, PyList>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let deadline = deadline(timeout)?;
        let objs: Vec<Obj> = objs.iter().map(Bound::unbind).collect();
        let mut pending = objs.into_iter().peekable();
        while pending.peek().is_some() {
            let (end, last) = slice_end(deadline);
            let (sent, ready) = py.detach(|| {
                let mut guard = lock(&self.inner);
                let Some(tx) = guard.as_mut() else {
                    return (Err(()), false);
                };
                let sent = tx.try_send_iter(&mut pending).map_err(|_| ());
                let ready = pending.peek().is_none()
                    || tx
                        .waker()
                        .clone()
                        .wait_until_deadline(|| tx.is_ready(), Some(end));
                (sent, ready)
            });
            if sent.is_err() {
                return closed();
            }
            if !ready {
                if last {
                    return Err(timed_out());
                }
                py.check_signals()?;
            }
        }
        Ok(())
    }

    /// Closes this end: the receiver gets the queued objects, then ChannelClosedError.
    fn close(&self, py: Python<'_>) {
        let end = py.detach(|| lock(&self.inner).take());
        drop(end);
    }

    /// Whether the receiver was closed (or this end was).
    #[getter]
    fn is_closed(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            lock(&self.inner)
                .as_ref()
                .is_none_or(|tx| tx.is_disconnected())
        })
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| lock(&self.inner).as_ref().map_or(0, |tx| tx.len()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close(py);
    }
}

#[pymethods]
impl PyReceiver {
    /// Receives the oldest object, waiting while the channel is empty (GIL released).
    /// Raises ChannelClosedError once the sender is closed and everything was received.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Obj> {
        let deadline = deadline(timeout)?;
        loop {
            let (end, last) = slice_end(deadline);
            let r = py.detach(|| match lock(&self.inner).as_mut() {
                Some(rx) => rx.recv_deadline(Some(end)),
                None => Err(RecvTimeoutError::Disconnected),
            });
            match r {
                Ok(v) => return Ok(v),
                Err(RecvTimeoutError::Disconnected) => return closed(),
                Err(RecvTimeoutError::Timeout) if last => return Err(timed_out()),
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            }
        }
    }

    /// The oldest object if one is queued, else `default`.
    #[pyo3(signature = (default=None))]
    fn try_recv(&self, py: Python<'_>, default: Option<Obj>) -> PyResult<Obj> {
        let r = py.detach(|| match lock(&self.inner).as_mut() {
            Some(rx) => rx.try_recv(),
            None => Err(TryRecvError::Disconnected),
        });
        match r {
            Ok(v) => Ok(v),
            Err(TryRecvError::Empty) => Ok(default.unwrap_or_else(|| py.None())),
            Err(TryRecvError::Disconnected) => closed(),
        }
    }

    /// Up to `max` queued objects, oldest first, waiting for at least one.
    #[pyo3(signature = (max, timeout=None))]
    fn recv_many(&self, py: Python<'_>, max: usize, timeout: Option<f64>) -> PyResult<Vec<Obj>> {
        let deadline = deadline(timeout)?;
        loop {
            let (end, last) = slice_end(deadline);
            let r = py.detach(|| {
                let mut guard = lock(&self.inner);
                let Some(rx) = guard.as_mut() else {
                    return Err(TryRecvError::Disconnected);
                };
                let mut out = Vec::new();
                match rx.try_recv_into(&mut out, max) {
                    Err(TryRecvError::Empty) => {
                        let waker = rx.waker().clone();
                        if waker.wait_until_deadline(|| rx.is_ready(), Some(end)) {
                            rx.try_recv_into(&mut out, max).map(|_| out)
                        } else {
                            Err(TryRecvError::Empty)
                        }
                    }
                    r => r.map(|_| out),
                }
            });
            match r {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Disconnected) => return closed(),
                Err(TryRecvError::Empty) if last => return Err(timed_out()),
                Err(TryRecvError::Empty) => py.check_signals()?,
            }
        }
    }

    /// Up to `max` objects queued right now (possibly none); never waits.
    fn try_recv_many(&self, py: Python<'_>, max: usize) -> PyResult<Vec<Obj>> {
        let r = py.detach(|| match lock(&self.inner).as_mut() {
            Some(rx) => {
                let mut out = Vec::new();
                rx.try_recv_into(&mut out, max).map(|_| out)
            }
            None => Err(TryRecvError::Disconnected),
        });
        match r {
            Ok(v) => Ok(v),
            Err(TryRecvError::Empty) => Ok(Vec::new()),
            Err(TryRecvError::Disconnected) => closed(),
        }
    }

    /// Closes this end, releasing the queued objects; the sender gets ChannelClosedError.
    fn close(&self, py: Python<'_>) {
        let end = py.detach(|| lock(&self.inner).take());
        // Dropped here, with the GIL: the queued objects are released at once.
        drop(end);
    }

    /// Whether the sender was closed (objects may still be queued) or this end was.
    #[getter]
    fn is_closed(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            lock(&self.inner)
                .as_ref()
                .is_none_or(|rx| rx.is_disconnected())
        })
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| lock(&self.inner).as_ref().map_or(0, |rx| rx.len()))
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Iterating receives until the sender is closed and the channel drained.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Obj>> {
        match self.recv(py, None) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_instance_of::<crate::errors::ChannelClosedError>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close(py);
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySender>()?;
    m.add_class::<PyReceiver>()?;
    m.add_function(wrap_pyfunction!(channel, m)?)?;
    Ok(())
}
