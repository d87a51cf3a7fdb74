//! Multi-threaded dataflow runtime: tasks on OS threads, SPSC channels, a checkpoint coordinator.
