//! The floor of a localnet fan-out (issue 37 item 5): how long the
//! kernel takes to hand the same encoded frame to N local clients, with
//! no gRPC, no HTTP/2 and no protobuf — one writer sending one shared
//! buffer to every socket as they take it (non-blocking, round robin, as
//! a server with one connection per client does), one reader draining
//! every socket as data arrives. What the daemon's full-frame `Watch` /
//! `Next` fan-out takes above this is ours; the goal is at most 1.5× it,
//! measured in the same run.
//!
//! ```text
//! let floor = fanout_floor::floor_ms(frame_bytes, 100, Transport::Unix, 3)?;
//! let ratio = fanout_ms / floor;
//! ```

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// The kind of local socket each client has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A unix stream socket pair per client (the daemon's `--localnet-socket`).
    Unix,
    /// A TCP connection over loopback per client (`--localnet-bind-address`).
    Tcp,
}

/// How much one write or read moves at most (a gRPC server's chunk is
/// smaller; bigger chunks only lower the floor).
const CHUNK: usize = 256 * 1024;

/// The fastest of `runs` fan-outs of a `frame_bytes`-byte frame to
/// `clients` sockets of `transport`, in milliseconds (see
/// [`fanout_ms`]).
pub fn floor_ms(
    frame_bytes: usize,
    clients: usize,
    transport: Transport,
    runs: usize,
) -> Result<f64> {
    let frame: Vec<u8> = (0..frame_bytes).map(|i| (i % 251) as u8).collect();
    let mut best = f64::INFINITY;
    for _ in 0..runs.max(1) {
        best = best.min(fanout_ms(&frame, clients, transport)?);
    }
    Ok(best)
}

/// Milliseconds from the first byte written until every one of
/// `clients` sockets has been read out holding all of `frame`: one
/// thread writes the one buffer to every socket, one thread reads them
/// all (the bench's two cores). Every byte read is checked.
pub fn fanout_ms(frame: &[u8], clients: usize, transport: Transport) -> Result<f64> {
    let (writers, readers) = pairs(clients, transport)?;
    for s in writers.iter().chain(&readers) {
        s.set_nonblocking(true).context("non-blocking socket")?;
    }
    let started = Instant::now();
    let got = std::thread::scope(|scope| -> Result<Vec<usize>> {
        let reader = scope.spawn(|| read_all(readers, frame));
        write_all(writers, frame)?;
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader panicked"))?
    })?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if let Some((i, n)) = got.iter().enumerate().find(|(_, n)| **n != frame.len()) {
        bail!("client {i} read {n} of {} bytes", frame.len());
    }
    Ok(ms)
}

/// A connected stream socket as both ends see it.
trait Socket: Read + Write + AsRawFd + Send {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()>;
}

impl Socket for std::os::unix::net::UnixStream {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_nonblocking(self, on)
    }
}

impl Socket for std::net::TcpStream {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        std::net::TcpStream::set_nonblocking(self, on)
    }
}

type Sockets = Vec<Box<dyn Socket>>;

/// `clients` connected pairs: (server ends, client ends).
fn pairs(clients: usize, transport: Transport) -> Result<(Sockets, Sockets)> {
    let (mut servers, mut clients_out): (Sockets, Sockets) = (Vec::new(), Vec::new());
    match transport {
        Transport::Unix => {
            for _ in 0..clients {
                let (a, b) = std::os::unix::net::UnixStream::pair().context("socket pair")?;
                servers.push(Box::new(a));
                clients_out.push(Box::new(b));
            }
        }
        Transport::Tcp => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").context("listening")?;
            let addr = listener.local_addr()?;
            for _ in 0..clients {
                let c = std::net::TcpStream::connect(addr).context("connecting")?;
                let (s, _) = listener.accept().context("accepting")?;
                c.set_nodelay(true)?;
                s.set_nodelay(true)?;
                servers.push(Box::new(s));
                clients_out.push(Box::new(c));
            }
        }
    }
    Ok((servers, clients_out))
}

/// Waits until one of `fds` is ready for `events`.
fn wait(fds: &[RawFd], events: libc::c_short) -> Result<()> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: *fd,
            events,
            revents: 0,
        })
        .collect();
    // SAFETY: `polls` is a valid array of `polls.len()` pollfd structs.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 10_000) };
    match n {
        n if n > 0 => Ok(()),
        0 => bail!("no socket ready within 10 s"),
        _ => Err(std::io::Error::last_os_error()).context("poll"),
    }
}

/// Writes `frame` to every socket, round robin, a chunk at a time as each
/// takes it.
fn write_all(mut socks: Sockets, frame: &[u8]) -> Result<()> {
    let mut sent = vec![0usize; socks.len()];
    loop {
        let mut progress = false;
        let mut pending = Vec::new();
        for (s, off) in socks.iter_mut().zip(sent.iter_mut()) {
            if *off == frame.len() {
                continue;
            }
            let end = (*off + CHUNK).min(frame.len());
            match s.write(&frame[*off..end]) {
                Ok(n) => {
                    *off += n;
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => pending.push(s.as_raw_fd()),
                Err(e) => return Err(e).context("writing"),
            }
        }
        if sent.iter().all(|n| *n == frame.len()) {
            return Ok(());
        }
        if !progress {
            wait(&pending, libc::POLLOUT)?;
        }
    }
}

/// Reads every socket out, checking each byte against `frame`; returns
/// the bytes read per socket.
fn read_all(mut socks: Sockets, frame: &[u8]) -> Result<Vec<usize>> {
    let mut got = vec![0usize; socks.len()];
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mut progress = false;
        let mut pending = Vec::new();
        for (i, s) in socks.iter_mut().enumerate() {
            if got[i] == frame.len() {
                continue;
            }
            let want = (frame.len() - got[i]).min(CHUNK);
            match s.read(&mut buf[..want]) {
                Ok(0) => bail!("client {i}: end of stream after {} bytes", got[i]),
                Ok(n) => {
                    if buf[..n] != frame[got[i]..got[i] + n] {
                        bail!("client {i}: other bytes than were sent");
                    }
                    got[i] += n;
                    progress = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => pending.push(s.as_raw_fd()),
                Err(e) => return Err(e).context("reading"),
            }
        }
        if got.iter().all(|n| *n == frame.len()) {
            return Ok(got);
        }
        if !progress {
            wait(&pending, libc::POLLIN)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_gets_the_whole_frame_on_both_transports() {
        let frame: Vec<u8> = (0..3_000_000).map(|i| (i * 7 % 256) as u8).collect();
        for t in [Transport::Unix, Transport::Tcp] {
            let ms = fanout_ms(&frame, 20, t).unwrap();
            assert!(ms > 0.0 && ms < 30_000.0, "{t:?}: {ms} ms");
        }
        assert!(floor_ms(1 << 20, 5, Transport::Unix, 2).unwrap() > 0.0);
    }

    #[test]
    fn more_clients_take_longer() {
        let one = floor_ms(8 << 20, 1, Transport::Unix, 3).unwrap();
        let many = floor_ms(8 << 20, 20, Transport::Unix, 3).unwrap();
        assert!(many > one, "1 client {one} ms, 20 clients {many} ms");
    }
}
