//! The runtime's view of a channel: items, a per-task wake-up signal and the
//! sending/receiving ends the tasks use. Kept behind this module so the ring
//! underneath can be swapped without touching the task loop.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crate::protocol::CheckpointId;
use crate::runtime::operator::Batch;

/// What travels on a channel.
#[derive(Clone, Debug)]
pub enum Item {
    Data(Batch),
    /// Barrier (or Chandy–Lamport marker) of checkpoint `id`.
    Barrier(CheckpointId),
    /// No more items will follow on this channel.
    EndOfStream,
}

/// Wakes one task thread: data arrived on an input, room appeared on an
/// output, or a control message came in.
#[derive(Debug, Default)]
pub struct Signal {
    thread: OnceLock<Thread>,
}

impl Signal {
    /// Binds the signal to the calling thread (once, at task start).
    pub fn register_current(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    pub fn notify(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Sleeps until notified or `timeout` passes (spurious wake-ups allowed).
    pub fn wait(&self, timeout: Duration) {
        std::thread::park_timeout(timeout);
    }
}

struct Ring {
    queue: Mutex<VecDeque<Item>>,
    capacity: usize,
    /// Signal of the receiving task.
    rx_signal: Arc<Signal>,
    /// Signal of the sending task.
    tx_signal: Arc<Signal>,
}

/// Sending end of one channel.
pub struct EdgeTx {
    ring: Arc<Ring>,
}

/// Receiving end of one channel.
pub struct EdgeRx {
    ring: Arc<Ring>,
}

/// A bounded FIFO of `capacity` items between the task owning `tx_signal`
/// and the task owning `rx_signal`.
pub fn edge(capacity: usize, tx_signal: Arc<Signal>, rx_signal: Arc<Signal>) -> (EdgeTx, EdgeRx) {
    let ring = Arc::new(Ring {
        queue: Mutex::new(VecDeque::with_capacity(capacity)),
        capacity,
        rx_signal,
        tx_signal,
    });
    (EdgeTx { ring: ring.clone() }, EdgeRx { ring })
}

impl EdgeTx {
    /// Pushes `item`, or gives it back if the channel is full.
    pub fn try_send(&self, item: Item) -> Result<(), Item> {
        {
            let mut q = self.ring.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= self.ring.capacity {
                return Err(item);
            }
            q.push_back(item);
        }
        self.ring.rx_signal.notify();
        Ok(())
    }
}

impl EdgeRx {
    pub fn try_recv(&self) -> Option<Item> {
        let item = self
            .ring
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        if item.is_some() {
            self.ring.tx_signal.notify();
        }
        item
    }

    /// The first barrier still queued behind data, if any (unaligned
    /// checkpoints overtake the data in front of it).
    pub fn queued_barrier(&self) -> Option<CheckpointId> {
        let q = self.ring.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().find_map(|item| match item {
            Item::Barrier(id) => Some(*id),
            _ => None,
        })
    }
}
