//! A task's outputs: partitions emitted batches onto the output channels,
//! waits (backpressure) when a channel is full, and keeps an unbounded
//! overflow for back-edges so that a loop can never block itself.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::graph::{OutputGroup, Partitioning};
use crate::operator::{Batch, Emitter};
use crate::protocol::CheckpointId;
use crate::runtime::edge::{EdgeTx, Item, SignalRef};
use crate::runtime::partition::Partitioner;

pub(crate) struct OutChannel {
    pub tx: EdgeTx,
    /// Records sent on this channel so far: the last record's number.
    pub sent: u64,
    /// Set by the receiver when it took end-of-stream: a restarted sender
    /// replaying to it drops what it sends (the receiver took it all).
    pub receiver_ended: Arc<AtomicBool>,
    /// Back-edges never block the sender: items wait here instead.
    pub unbounded: bool,
    /// Data on this channel counts towards its cycle's in-flight total.
    pub loop_counter: Option<Arc<AtomicI64>>,
    pub overflow: VecDeque<Item>,
}

struct Group {
    port: usize,
    partitioning: Partitioning,
    /// Indices into `Outputs::channels`, by receiving subtask.
    channels: Vec<usize>,
    next: usize,
}

/// The [`Emitter`] a task hands to its operator.
pub(crate) struct Outputs {
    channels: Vec<OutChannel>,
    groups: Vec<Group>,
    partitioner: Partitioner,
    signal: SignalRef,
    cancel: Arc<AtomicBool>,
    pub records_out: u64,
    /// Records not sent because their receiver had already ended.
    pub replayed_dropped: u64,
    /// Set once end-of-stream went out; later data is an operator bug.
    pub closed: bool,
}

/// The error a task returns when it stops because the job was cancelled.
pub(crate) fn cancelled() -> Error {
    Error::Task("job cancelled".into())
}

impl Outputs {
    pub fn new(
        groups: &[OutputGroup],
        channels: Vec<OutChannel>,
        channel_ids: &[usize],
        signal: SignalRef,
        cancel: Arc<AtomicBool>,
    ) -> Self {
        // channel_ids[i] = physical id of self.channels[i]
        let local = |id: usize| {
            channel_ids
                .iter()
                .position(|&c| c == id)
                .expect("own channel")
        };
        let groups = groups
            .iter()
            .map(|g| Group {
                port: g.port,
                partitioning: g.partitioning.clone(),
                channels: g.channels.iter().map(|&c| local(c)).collect(),
                next: 0,
            })
            .collect();
        Self {
            channels,
            groups,
            partitioner: Partitioner::default(),
            signal,
            cancel,
            records_out: 0,
            replayed_dropped: 0,
            closed: false,
        }
    }

    /// Records sent per output channel: what a checkpoint records.
    pub fn sent_seqs(&self) -> Vec<u64> {
        self.channels.iter().map(|c| c.sent).collect()
    }

    /// Barrier `id` on every output, behind everything emitted so far.
    pub fn barrier(&mut self, id: CheckpointId) -> Result<()> {
        for c in 0..self.channels.len() {
            let seq = self.channels[c].sent;
            self.push(c, Item::Barrier { id, seq })?;
        }
        Ok(())
    }

    fn push_data(&mut self, c: usize, batch: Batch) -> Result<()> {
        let ch = &mut self.channels[c];
        let n = batch.num_rows() as u64;
        if ch.receiver_ended.load(Ordering::Relaxed) {
            self.replayed_dropped += n;
            return Ok(());
        }
        ch.sent += n;
        let end = ch.sent;
        self.push(c, Item::Data { batch, end })
    }

    pub fn end_of_stream(&mut self) -> Result<()> {
        for c in 0..self.channels.len() {
            self.push(c, Item::EndOfStream)?;
        }
        self.closed = true;
        Ok(())
    }

    /// Moves overflowed back-edge items into their channels as room appears.
    pub fn flush_overflow(&mut self) {
        for ch in &mut self.channels {
            while let Some(item) = ch.overflow.pop_front() {
                if let Err(item) = ch.tx.try_send(item) {
                    ch.overflow.push_front(item);
                    break;
                }
            }
        }
    }

    pub fn has_overflow(&self) -> bool {
        self.channels.iter().any(|c| !c.overflow.is_empty())
    }

    fn push(&mut self, c: usize, item: Item) -> Result<()> {
        let ch = &mut self.channels[c];
        if let (Item::Data { .. }, Some(counter)) = (&item, &ch.loop_counter) {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        if !ch.overflow.is_empty() {
            ch.overflow.push_back(item);
            return Ok(());
        }
        let mut item = match ch.tx.try_send(item) {
            Ok(()) => return Ok(()),
            Err(item) => item,
        };
        if ch.unbounded {
            ch.overflow.push_back(item);
            return Ok(());
        }
        loop {
            if self.channels[c].receiver_ended.load(Ordering::Relaxed) {
                return Ok(()); // a replay to a receiver that took everything
            }
            if self.cancel.load(Ordering::Relaxed) || self.channels[c].tx.is_disconnected() {
                return Err(cancelled());
            }
            let (tx, cancel) = (&self.channels[c].tx, &self.cancel);
            self.signal.wait_until_timeout(
                || tx.is_ready() || cancel.load(Ordering::Relaxed),
                Duration::from_millis(10),
            );
            match self.channels[c].tx.try_send(item) {
                Ok(()) => return Ok(()),
                Err(back) => item = back,
            }
        }
    }

    fn route(&mut self, g: usize, batch: Batch) -> Result<()> {
        let n = self.groups[g].channels.len();
        match &self.groups[g].partitioning {
            Partitioning::Forward => {
                let c = self.groups[g].channels[0];
                self.push_data(c, batch)
            }
            Partitioning::Broadcast => {
                for i in 0..n {
                    let c = self.groups[g].channels[i];
                    self.push_data(c, batch.clone())?;
                }
                Ok(())
            }
            Partitioning::RoundRobin => {
                let grp = &mut self.groups[g];
                let c = grp.channels[grp.next % n];
                grp.next = (grp.next + 1) % n;
                self.push_data(c, batch)
            }
            Partitioning::Hash { .. } => {
                // Borrow the key without cloning it per batch.
                let part =
                    std::mem::replace(&mut self.groups[g].partitioning, Partitioning::Forward);
                let Partitioning::Hash { key } = &part else {
                    unreachable!("matched above")
                };
                let mut partitioner = std::mem::take(&mut self.partitioner);
                let res = partitioner.split(&batch, key, n, |p, sub| {
                    let c = self.groups[g].channels[p];
                    self.push_data(c, sub)
                });
                self.partitioner = partitioner;
                self.groups[g].partitioning = part;
                res
            }
        }
    }
}

impl Emitter for Outputs {
    fn emit(&mut self, batch: Batch) -> Result<()> {
        self.emit_to(0, batch)
    }

    fn emit_to(&mut self, port: usize, batch: Batch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.closed {
            return Err(Error::Task(
                "operator emitted data after its end of stream (operators on a cycle must not emit from finish())"
                    .into(),
            ));
        }
        let mut sent = false;
        for g in 0..self.groups.len() {
            if self.groups[g].port == port {
                self.route(g, batch.clone())?;
                sent = true;
            }
        }
        if sent {
            self.records_out += batch.num_rows() as u64;
        }
        Ok(())
    }
}
