//! Snapshot store: Arrow IPC files + manifest, atomic commit, checksums, retention, verify.
