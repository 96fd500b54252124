//! Load for the NodePort cell: a request/response TCP server and the
//! clients that measure it, as threads of this process, each moved into
//! the network namespace it works in. Neither joins the daemon's cgroup
//! (the socket hooks must not serve them), and no interpreter or process
//! start sits in the measured path, so the datapath is what varies.
//!
//! The protocol: the client writes [`MSG`] bytes, the server answers
//! [`MSG`] bytes, as often as the client asks on one connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Bytes of a request and of its answer.
pub const MSG: usize = 64;
/// Bounds every blocking call, so that no thread outlives the cell by more.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Moves the calling thread into network namespace `name` (sockets it
/// opens from then on live there).
pub fn enter_netns(name: &str) -> Result<()> {
    let ns = std::fs::File::open(format!("/run/netns/{name}"))
        .with_context(|| format!("opening netns {name}"))?;
    // SAFETY: setns on a valid, open netns descriptor; it changes only the
    // calling thread's namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The request/response server: a fixed pool of threads accepting on one
/// listener, each serving a connection to its end (no thread start per
/// connection in the measured path).
pub struct Server {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` in `netns` with `workers` threads (at least the
    /// number of connections the clients hold at once).
    pub fn start(netns: &str, addr: SocketAddr, workers: usize) -> Result<Server> {
        let netns = netns.to_owned();
        let listener = std::thread::spawn(move || -> Result<TcpListener> {
            enter_netns(&netns)?;
            TcpListener::bind(addr).with_context(|| format!("binding {addr} in {netns}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the listener thread panicked"))??;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|_| {
                let (listener, stop) = (listener.clone(), stop.clone());
                std::thread::spawn(move || accept_loop(&listener, &stop))
            })
            .collect();
        Ok(Server {
            listener,
            stop,
            workers,
        })
    }
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => serve(stream),
            // Shut down (see Drop), or a transient accept error: look at
            // the flag again.
            Err(_) => {
                if !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

fn serve(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut buf = [0u8; MSG];
    // Until the client closes (or goes silent for IO_TIMEOUT).
    while stream.read_exact(&mut buf).is_ok() {
        if stream.write_all(&buf).is_err() {
            break;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // shutdown(2) on a listening socket wakes every thread blocked in
        // accept(2) on it (Linux), so the pool can be joined.
        // SAFETY: a valid socket descriptor owned by `self.listener`.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// What one measurement counted.
#[derive(Clone, Debug, Default)]
pub struct Load {
    /// Requests answered inside the window.
    pub ok: u64,
    /// Failed connects, requests or answers (the whole run, warm-up too).
    pub errors: u64,
    pub first_error: Option<String>,
    pub window: Duration,
}

impl Load {
    pub fn per_second(&self) -> f64 {
        self.ok as f64 / self.window.as_secs_f64()
    }

    fn add(&mut self, other: Load) {
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// How a client uses its connections.
#[derive(Clone, Copy, Debug)]
pub enum Pattern {
    /// Connect, one request, close, again (`threads` clients at once).
    ShortConnections { threads: usize },
    /// `connections` connections held open, requests back to back on each.
    Persistent { connections: usize },
}

/// Runs `pattern` from `netns` against `target` for `warmup` + `window`,
/// counting the requests answered in the window.
pub fn measure(
    netns: &str,
    target: SocketAddr,
    pattern: Pattern,
    warmup: Duration,
    window: Duration,
) -> Result<Load> {
    let (threads, persistent) = match pattern {
        Pattern::ShortConnections { threads } => (threads, false),
        Pattern::Persistent { connections } => (connections, true),
    };
    let start = Instant::now() + Duration::from_millis(20);
    let counted_from = start + warmup;
    let end = counted_from + window;
    let mut total = Load {
        window,
        ..Load::default()
    };
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || -> Result<Load> {
                    enter_netns(netns)?;
                    while Instant::now() < start {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Ok(client(target, persistent, counted_from, end))
                })
            })
            .collect();
        for h in handles {
            let load = h
                .join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
            total.add(load);
        }
        Ok(())
    })?;
    Ok(total)
}

fn connect(target: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&target, IO_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

fn request(s: &mut TcpStream, buf: &mut [u8; MSG]) -> std::io::Result<()> {
    s.write_all(buf)?;
    s.read_exact(buf)
}

/// One client thread until `end`.
fn client(target: SocketAddr, persistent: bool, counted_from: Instant, end: Instant) -> Load {
    let mut load = Load::default();
    let mut buf = [b'x'; MSG];
    let mut held: Option<TcpStream> = None;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let result = match held.take() {
            Some(s) => Ok(s),
            None => connect(target),
        }
        .and_then(|mut s| request(&mut s, &mut buf).map(|()| s));
        match result {
            Ok(s) => {
                let t = Instant::now();
                if t >= counted_from && t < end {
                    load.ok += 1;
                }
                if persistent {
                    held = Some(s);
                }
            }
            Err(e) => {
                load.errors += 1;
                load.first_error.get_or_insert_with(|| e.to_string());
                // A refusal returns at once: do not spin on it.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    load
}

/// One request on a fresh connection, for probes: whether it was answered.
pub fn answers(netns: &str, target: SocketAddr, timeout: Duration) -> Result<bool> {
    let netns = netns.to_owned();
    std::thread::spawn(move || -> Result<bool> {
        enter_netns(&netns)?;
        let Ok(mut s) = TcpStream::connect_timeout(&target, timeout) else {
            return Ok(false);
        };
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(request(&mut s, &mut [b'p'; MSG]).is_ok())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
}
