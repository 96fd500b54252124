//! Per-client admission for the PodInfo API (SPEC §7.3): a token bucket
//! (`--podinfo-qps` refill, `--podinfo-burst` size) and at most
//! [`MAX_WATCHES_PER_CLIENT`] open watch streams per client.
//!
//! A client is the process at the other end of the unix socket (its
//! `SO_PEERCRED` uid and pid), or the connection when the kernel gives no
//! credentials. Time is passed in, so the arithmetic is tested without
//! sleeping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Open watch streams allowed per client.
pub const MAX_WATCHES_PER_CLIENT: usize = 16;
/// Past this many tracked clients, idle ones (full bucket, no watch) are
/// forgotten; forgetting them loses nothing, as a new client starts full.
const PRUNE_ABOVE: usize = 256;

/// Who is calling: the peer the unix-socket layer identified.
pub use crate::grpc_unix::Peer as ClientKey;

/// `--podinfo-qps` and `--podinfo-burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second.
    pub qps: f64,
    /// Bucket size, and what a new client starts with.
    pub burst: u32,
}

impl Default for RateLimit {
    /// kubelet's podresources defaults.
    fn default() -> Self {
        Self {
            qps: 100.0,
            burst: 10,
        }
    }
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("rejected by rate limit")]
    RateLimited,
    #[error("too many watch streams: at most {MAX_WATCHES_PER_CLIENT} per client")]
    TooManyWatches,
}

#[derive(Debug)]
struct Client {
    tokens: f64,
    refilled: Instant,
    watches: usize,
}

impl Client {
    fn refill(&mut self, limit: RateLimit, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limit.qps).min(f64::from(limit.burst));
        self.refilled = now;
    }

    fn idle(&self, limit: RateLimit) -> bool {
        self.watches == 0 && self.tokens >= f64::from(limit.burst)
    }
}

/// Shared by every connection of one server.
#[derive(Debug)]
pub struct Limiter {
    limit: RateLimit,
    clients: Mutex<HashMap<ClientKey, Client>>,
}

impl Limiter {
    pub fn new(limit: RateLimit) -> Arc<Self> {
        Arc::new(Self {
            limit,
            clients: Mutex::new(HashMap::new()),
        })
    }

    fn clients(&self) -> MutexGuard<'_, HashMap<ClientKey, Client>> {
        // The map holds plain counters that are never left half-updated, so
        // a panic elsewhere while holding the lock leaves nothing to repair.
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one token for a unary call.
    pub fn admit(&self, key: ClientKey, now: Instant) -> Result<(), Rejection> {
        self.take(key, now, false)
    }

    /// Takes one token and one watch slot; the slot is freed when the
    /// returned guard is dropped (the stream ended or the client left).
    pub fn open_watch(
        self: &Arc<Self>,
        key: ClientKey,
        now: Instant,
    ) -> Result<WatchSlot, Rejection> {
        self.take(key, now, true)?;
        Ok(WatchSlot {
            limiter: self.clone(),
            key,
        })
    }

    fn take(&self, key: ClientKey, now: Instant, watch: bool) -> Result<(), Rejection> {
        let limit = self.limit;
        let mut clients = self.clients();
        if clients.len() > PRUNE_ABOVE {
            clients.retain(|_, c| {
                c.refill(limit, now);
                !c.idle(limit)
            });
        }
        let client = clients.entry(key).or_insert_with(|| Client {
            tokens: f64::from(limit.burst),
            refilled: now,
            watches: 0,
        });
        client.refill(limit, now);
        if watch && client.watches >= MAX_WATCHES_PER_CLIENT {
            return Err(Rejection::TooManyWatches);
        }
        if client.tokens < 1.0 {
            return Err(Rejection::RateLimited);
        }
        client.tokens -= 1.0;
        if watch {
            client.watches += 1;
        }
        Ok(())
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.clients().len()
    }
}

/// One open watch stream of one client.
#[derive(Debug)]
pub struct WatchSlot {
    limiter: Arc<Limiter>,
    key: ClientKey,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        if let Some(c) = self.limiter.clients().get_mut(&self.key) {
            c.watches = c.watches.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const A: ClientKey = ClientKey::Process { uid: 0, pid: 100 };
    const B: ClientKey = ClientKey::Process { uid: 0, pid: 200 };

    #[test]
    fn a_client_gets_its_burst_then_the_refill_rate_and_others_are_unaffected() {
        let l = Limiter::new(RateLimit::default());
        let t0 = Instant::now();
        for i in 0..10 {
            assert_eq!(l.admit(A, t0), Ok(()), "call {i} is within the burst");
        }
        assert_eq!(l.admit(A, t0), Err(Rejection::RateLimited));
        assert_eq!(l.admit(B, t0), Ok(()), "another process has its own bucket");
        // 100/s: one token per 10 ms.
        assert_eq!(
            l.admit(A, t0 + Duration::from_millis(5)),
            Err(Rejection::RateLimited)
        );
        assert_eq!(l.admit(A, t0 + Duration::from_millis(10)), Ok(()));
        assert_eq!(
            l.admit(A, t0 + Duration::from_millis(10)),
            Err(Rejection::RateLimited)
        );
        // Idle for long: the bucket is full again, not fuller.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(l.admit(A, later), Ok(()));
        }
        assert_eq!(l.admit(A, later), Err(Rejection::RateLimited));
        assert_eq!(Rejection::RateLimited.to_string(), "rejected by rate limit");
    }

    #[test]
    fn at_most_sixteen_watches_per_client_and_a_closed_one_frees_its_slot() {
        let l = Limiter::new(RateLimit {
            qps: 100.0,
            burst: 100,
        });
        let t0 = Instant::now();
        let mut slots: Vec<WatchSlot> = (0..MAX_WATCHES_PER_CLIENT)
            .map(|_| l.open_watch(A, t0).unwrap())
            .collect();
        assert_eq!(l.open_watch(A, t0).unwrap_err(), Rejection::TooManyWatches);
        assert!(l.open_watch(B, t0).is_ok(), "other clients are unaffected");
        assert_eq!(l.admit(A, t0), Ok(()), "unary calls are not capped");
        slots.pop();
        assert!(l.open_watch(A, t0).is_ok());
    }

    #[test]
    fn watches_take_a_token_too() {
        let l = Limiter::new(RateLimit { qps: 1.0, burst: 2 });
        let t0 = Instant::now();
        let _w = l.open_watch(A, t0).unwrap();
        assert_eq!(l.admit(A, t0), Ok(()));
        assert_eq!(l.open_watch(A, t0).unwrap_err(), Rejection::RateLimited);
    }

    #[test]
    fn idle_clients_are_forgotten_but_busy_ones_are_kept() {
        let l = Limiter::new(RateLimit::default());
        let t0 = Instant::now();
        let _watching = l.open_watch(A, t0).unwrap();
        for pid in 1000..1000 + PRUNE_ABOVE as i32 {
            l.admit(ClientKey::Process { uid: 0, pid }, t0).unwrap();
        }
        // A second later every bucket is full again; only A holds a watch.
        l.admit(B, t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(l.tracked(), 2);
    }
}
