//! Lock-free bounded single-producer single-consumer FIFO ring: the edge between two tasks.
