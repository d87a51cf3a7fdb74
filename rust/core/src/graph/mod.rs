//! Logical dataflow graph → physical tasks and channels; back-edge detection.
