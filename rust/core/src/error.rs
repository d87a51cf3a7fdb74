//! The one error enum of snapcut-core. The Python bindings map each variant to
//! one Python exception class in a single place (`rust/py/src/errors.rs`).

/// Every fallible operation of snapcut-core returns this error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The other end of a channel was dropped.
    #[error("channel disconnected: the other end was dropped")]
    Disconnected,
    /// A configuration value is invalid; the message names the value and the fix.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The dataflow graph is malformed (unknown vertex, unreachable vertex, sourceless cycle).
    #[error("invalid graph: {0}")]
    Graph(String),
    /// A snapshot on disk is missing, partial, corrupt or of an unsupported format.
    #[error("snapshot error: {0}")]
    Snapshot(String),
    /// A user function or operator failed while the job ran.
    #[error("task failed: {0}")]
    Task(String),
    /// An I/O error, with the path or operation it concerns.
    #[error("I/O error ({context}): {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias for snapcut-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with what was being done and on which path.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<crate::channel::CapacityError> for Error {
    fn from(e: crate::channel::CapacityError) -> Self {
        Error::Config(e.0)
    }
}

impl<T> From<crate::channel::SendError<T>> for Error {
    fn from(_: crate::channel::SendError<T>) -> Self {
        Error::Disconnected
    }
}

impl From<crate::channel::RecvError> for Error {
    fn from(_: crate::channel::RecvError) -> Self {
        Error::Disconnected
    }
}

#[cfg(test)]
mod tests {
    use super::Error;
    use crate::channel::{channel, try_channel};

    #[test]
    fn channel_errors_become_core_errors() {
        let capacity: Error = try_channel::<u8>(0).unwrap_err().into();
        assert!(matches!(capacity, Error::Config(ref m) if m.contains("at least 1")));
        let (mut tx, rx) = channel::<u8>(1);
        drop(rx);
        let sent: Error = tx.send(1).unwrap_err().into();
        assert!(matches!(sent, Error::Disconnected));
    }
}
