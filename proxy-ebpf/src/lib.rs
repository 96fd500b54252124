#![no_std]
//! Placeholder for the eBPF programs (socket-LB cgroup hooks, tc programs).
//!
//! No program exists yet: the daemon has no eBPF datapath and refuses
//! `--proxy-mode ebpf` until the eBPF datapath issue lands.
