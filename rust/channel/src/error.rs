//! std-like error types; every send error hands the unsent value back.

use std::fmt;

/// `try_send` failed: the ring is full, or the receiver is gone.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum TrySendError<T> {
    /// No free slot right now.
    Full(T),
    /// The receiver was dropped; the value can never be delivered.
    Disconnected(T),
}

/// `send` failed because the receiver was dropped.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

/// `send_timeout` failed.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum SendTimeoutError<T> {
    /// The ring stayed full for the whole timeout.
    Timeout(T),
    /// The receiver was dropped.
    Disconnected(T),
}

/// `try_recv` failed: nothing queued, or nothing queued and the sender is gone.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum TryRecvError {
    /// Nothing queued right now.
    Empty,
    /// Nothing queued and the sender was dropped: nothing will ever arrive.
    Disconnected,
}

/// `recv` failed: the sender was dropped and everything it sent was received.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct RecvError;

/// `recv_timeout` failed.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum RecvTimeoutError {
    /// Nothing arrived within the timeout.
    Timeout,
    /// The sender was dropped and everything it sent was received.
    Disconnected,
}

impl<T> TrySendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(v) | Self::Disconnected(v) => v,
        }
    }

    /// Whether the ring was full (as opposed to disconnected).
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full(_))
    }

    /// Whether the receiver is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, Self::Disconnected(_))
    }
}

impl<T> SendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> SendTimeoutError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            Self::Timeout(v) | Self::Disconnected(v) => v,
        }
    }
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("Full(..)"),
            Self::Disconnected(_) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Debug for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(_) => f.write_str("Timeout(..)"),
            Self::Disconnected(_) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(_) => f.write_str("sending on a full channel"),
            Self::Disconnected(_) => f.write_str("sending on a disconnected channel"),
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sending on a disconnected channel")
    }
}

impl<T> fmt::Display for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(_) => f.write_str("timed out waiting on a full channel"),
            Self::Disconnected(_) => f.write_str("sending on a disconnected channel"),
        }
    }
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("receiving on an empty channel"),
            Self::Disconnected => f.write_str("receiving on an empty, disconnected channel"),
        }
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("receiving on an empty, disconnected channel")
    }
}

impl fmt::Display for RecvTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("timed out waiting on an empty channel"),
            Self::Disconnected => f.write_str("receiving on an empty, disconnected channel"),
        }
    }
}

impl<T> std::error::Error for TrySendError<T> {}
impl<T> std::error::Error for SendError<T> {}
impl<T> std::error::Error for SendTimeoutError<T> {}
impl std::error::Error for TryRecvError {}
impl std::error::Error for RecvError {}
impl std::error::Error for RecvTimeoutError {}

/// A capacity the channel cannot have (0, or more slots than memory holds);
/// the message names it and the fix. snapcut-core reports it as a config error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityError(pub String);

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CapacityError {}
