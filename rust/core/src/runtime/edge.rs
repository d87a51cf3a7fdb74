//! The runtime's view of a channel: items, the per-task waker and the
//! sending/receiving ends, over the SPSC ring of [`crate::channel`].

use crate::channel::{channel_with_wakers, Receiver, Sender, TaskWaker, TryRecvError};
use crate::error::Result;
use crate::operator::Batch;
use crate::protocol::CheckpointId;

/// What travels on a channel. A channel numbers its records 1, 2, … (the
/// "channel data id" of SeaTunnel's regional failover): a receiver drops
/// records numbered at or below the last one it took, which is how a
/// healthy task skips what a restarted upstream replays.
#[derive(Clone, Debug)]
pub enum Item {
    /// A batch whose last record is number `end` on this channel.
    Data { batch: Batch, end: u64 },
    /// Barrier (or Chandy–Lamport marker) of checkpoint `id`, after `seq`
    /// records: the position a receiver's checkpoint records.
    Barrier { id: CheckpointId, seq: u64 },
    /// No more items will follow on this channel.
    EndOfStream,
}

/// Wakes one task thread: data arrived on an input, room appeared on an
/// output, or a control message came in. One per task, shared by all its ends.
pub type Signal = TaskWaker;

/// The shared handle of a [`Signal`]: the channel's waker handle.
pub type SignalRef = crate::channel::WakerRef;

/// Sending end of one channel.
pub struct EdgeTx {
    tx: Sender<Item>,
}

/// Receiving end of one channel.
pub struct EdgeRx {
    rx: Receiver<Item>,
}

impl std::fmt::Debug for EdgeRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EdgeRx")
    }
}

/// A bounded FIFO of `capacity` items from the task owning `tx_signal` to
/// the task owning `rx_signal`.
pub fn edge(
    capacity: usize,
    tx_signal: SignalRef,
    rx_signal: SignalRef,
) -> Result<(EdgeTx, EdgeRx)> {
    let (tx, rx) = channel_with_wakers(capacity, tx_signal, rx_signal)?;
    Ok((EdgeTx { tx }, EdgeRx { rx }))
}

impl EdgeTx {
    /// Pushes `item`, or gives it back if the channel is full.
    #[inline]
    pub fn try_send(&mut self, item: Item) -> Result<(), Item> {
        self.tx.try_send(item).map_err(|e| e.into_inner())
    }

    /// True if a send would not block (room, or the receiver is gone).
    pub fn is_ready(&self) -> bool {
        self.tx.is_ready()
    }

    pub fn is_disconnected(&self) -> bool {
        self.tx.is_disconnected()
    }
}

/// What a non-blocking receive found.
pub enum Recv {
    Item(Item),
    Empty,
    /// The sender is gone and everything it sent was received.
    Closed,
}

impl EdgeRx {
    #[inline]
    pub fn try_recv(&mut self) -> Recv {
        match self.rx.try_recv() {
            Ok(item) => Recv::Item(item),
            Err(TryRecvError::Empty) => Recv::Empty,
            Err(TryRecvError::Disconnected) => Recv::Closed,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.rx.is_ready()
    }

    /// The first barrier still queued behind data, if any (unaligned
    /// checkpoints overtake the data in front of it).
    pub fn queued_barrier(&self) -> Option<CheckpointId> {
        self.rx.queued().find_map(|item| match item {
            Item::Barrier { id, .. } => Some(*id),
            _ => None,
        })
    }
}
