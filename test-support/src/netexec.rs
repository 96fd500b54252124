//! A netexec-like echo server for test pods and the matching client.
//!
//! Server: answers every line on a TCP connection and every UDP datagram
//! with `<pod name> <local port> <client address>\n`, on any number of
//! ports, IPv4 and IPv6. The client address is the peer the pod's kernel
//! reports, so a test sees whether the datapath kept the client's source
//! address or replaced it with a node's.
//!
//! Client: sends `count` requests (or runs for a duration) to one target and
//! prints one line per request: `ok <pod> port=<n> peer=<addr> seen=<ip>
//! ms=<n>` (`peer`: the address the client's socket reports as its peer;
//! `seen`: the source address the pod saw) or `err <reason> ms=<n>`, so the
//! scenario sees exactly what a user would.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// `netexec --name POD [--tcp PORT]... [--udp PORT]...`
pub fn serve(args: &[String]) -> Result<()> {
    let mut name = None;
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().context("flag needs a value");
        match a.as_str() {
            "--name" => name = Some(value()?),
            "--tcp" => tcp.push(value()?.parse::<u16>()?),
            "--udp" => udp.push(value()?.parse::<u16>()?),
            other => bail!("netexec: unknown argument {other}"),
        }
    }
    let name = name.context("netexec: --name is required")?;
    let mut threads = Vec::new();
    for port in tcp {
        // [::] with IPV6_V6ONLY off (Linux default) serves IPv4 too.
        let l = TcpListener::bind(("::", port)).with_context(|| format!("tcp {port}"))?;
        let name = name.clone();
        threads.push(std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let name = name.clone();
                std::thread::spawn(move || answer_tcp(conn, &name, port));
            }
        }));
    }
    for port in udp {
        let s = UdpSocket::bind(("::", port)).with_context(|| format!("udp {port}"))?;
        let name = name.clone();
        threads.push(std::thread::spawn(move || {
            // Room for a datagram of any size: a large request (the
            // client's `--payload-bytes`) is answered only when it arrived
            // whole.
            let mut buf = vec![0u8; 65536];
            while let Ok((_, peer)) = s.recv_from(&mut buf) {
                let reply = format!("{name} {port} {}\n", canonical(peer));
                let _ = s.send_to(reply.as_bytes(), peer);
            }
        }));
    }
    println!("ready");
    std::io::stdout().flush()?;
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn answer_tcp(conn: TcpStream, name: &str, port: u16) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let peer = match conn.peer_addr() {
        Ok(p) => canonical(p),
        Err(_) => return,
    };
    let mut reader = BufReader::new(&conn);
    // One answer per line, until the client closes: a long-lived client
    // (`--hold`) keeps one connection, and one flow, for all its requests.
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if (&conn)
            .write_all(format!("{name} {port} {peer}\n").as_bytes())
            .is_err()
        {
            return;
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

/// `client --proto tcp|udp --target ADDR:PORT [--count N] [--duration-ms D]
///  [--interval-ms I] [--timeout-ms T] [--reuse] [--connect] [--hold]`
///
/// `--reuse` keeps one UDP socket for all requests (a long-lived client;
/// reopened after an error other than a timeout);
/// `--connect` connect()s each UDP socket to the target and uses send/recv
/// (a connected client, such as a resolver); `--hold` keeps one TCP
/// connection for all requests, opening a new one only after an error.
pub fn client(args: &[String]) -> Result<()> {
    let mut proto = Proto::Tcp;
    let mut target: Option<SocketAddr> = None;
    let mut count = 1u64;
    let mut duration = None;
    let mut interval = Duration::ZERO;
    let mut timeout = Duration::from_millis(1000);
    let mut reuse = false;
    let mut connect = false;
    let mut hold = false;
    let mut payload = b"hello\n".to_vec();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().context("flag needs a value");
        match a.as_str() {
            "--proto" => {
                proto = match value()?.as_str() {
                    "tcp" => Proto::Tcp,
                    "udp" => Proto::Udp,
                    p => bail!("client: unknown protocol {p}"),
                }
            }
            "--target" => target = Some(value()?.parse()?),
            "--count" => count = value()?.parse()?,
            "--duration-ms" => duration = Some(Duration::from_millis(value()?.parse()?)),
            "--interval-ms" => interval = Duration::from_millis(value()?.parse()?),
            "--timeout-ms" => timeout = Duration::from_millis(value()?.parse()?),
            "--reuse" => reuse = true,
            "--connect" => connect = true,
            "--hold" => hold = true,
            // A UDP request of N bytes (at least the 6 of `hello\n`): over
            // the path MTU it leaves the client as IP fragments.
            "--payload-bytes" => {
                let n: usize = value()?.parse()?;
                payload.resize(n.max(payload.len()), b'.');
            }
            other => bail!("client: unknown argument {other}"),
        }
    }
    let target = target.context("client: --target is required")?;
    let started = Instant::now();
    let mut shared_udp: Option<UdpSocket> = None;
    let mut held_tcp: Option<TcpStream> = None;
    let mut out = std::io::stdout().lock();
    let mut sent = 0u64;
    loop {
        match duration {
            Some(d) if started.elapsed() >= d => break,
            None if sent >= count => break,
            _ => {}
        }
        sent += 1;
        let t = Instant::now();
        let result = match proto {
            Proto::Tcp if hold => match held_tcp.take() {
                Some(conn) => Ok(conn),
                None => tcp_connect(target, timeout),
            }
            .and_then(|conn| {
                let answer = tcp_exchange(&conn)?;
                held_tcp = Some(conn);
                Ok(answer)
            }),
            Proto::Tcp => tcp_connect(target, timeout).and_then(|conn| tcp_exchange(&conn)),
            Proto::Udp => {
                if reuse {
                    if shared_udp.is_none() {
                        shared_udp = Some(udp_socket(target, timeout, connect)?);
                    }
                    let r = shared_udp
                        .as_ref()
                        .map(|s| udp_request(s, target, connect, &payload))
                        .unwrap_or_else(|| Err("no socket".to_owned()));
                    // A socket the kernel aborted or disconnected (its
                    // backend went away) is opened and connected again, as
                    // a resolver does; a timeout keeps it.
                    if r.as_ref().is_err_and(|e| {
                        !e.contains("timed out") && !e.contains("Resource temporarily unavailable")
                    }) {
                        shared_udp = None;
                    }
                    r
                } else {
                    udp_socket(target, timeout, connect)
                        .map_err(|e| e.to_string())
                        .and_then(|s| udp_request(&s, target, connect, &payload))
                }
            }
        };
        let ms = t.elapsed().as_millis();
        match result {
            Ok(((answer, seen), peer)) => {
                writeln!(out, "ok {answer} peer={peer} seen={seen} ms={ms}")?
            }
            Err(e) => writeln!(out, "err {} ms={ms}", e.replace(' ', "_"))?,
        }
        out.flush()?;
        if !interval.is_zero() {
            std::thread::sleep(interval);
        }
    }
    Ok(())
}

/// An answer (`<pod> port=<n>`, the source address the pod saw) and the
/// client socket's peer address.
type Answer = ((String, String), String);

fn tcp_connect(target: SocketAddr, timeout: Duration) -> Result<TcpStream, String> {
    let conn = TcpStream::connect_timeout(&target, timeout).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// One line out, one line back. The answer is a single short line, sent
/// after the request arrived: no partial line is left in a buffer between
/// two exchanges of a held connection.
fn tcp_exchange(conn: &TcpStream) -> Result<Answer, String> {
    // What the application sees as its peer: the VIP when rev-NAT works.
    let peer = conn
        .peer_addr()
        .map(canonical)
        .map_err(|e| format!("getpeername: {e}"))?;
    let mut stream = conn;
    stream
        .write_all(b"hello\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut line = String::new();
    let n = BufReader::new(conn)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Err("read: connection closed".to_owned());
    }
    Ok((parse_answer(&line)?, peer.to_string()))
}

fn udp_socket(target: SocketAddr, timeout: Duration, connect: bool) -> Result<UdpSocket> {
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let s = UdpSocket::bind(bind)?;
    s.set_read_timeout(Some(timeout))?;
    if connect {
        s.connect(target)?;
    }
    Ok(s)
}

/// Unconnected sendto/recvfrom: sendmsg and recvmsg hooks at work; the
/// reply's source must read as the VIP. Connected: send/recv, the peer is
/// what the socket was connected to (getpeername).
fn udp_request(
    s: &UdpSocket,
    target: SocketAddr,
    connected: bool,
    payload: &[u8],
) -> Result<Answer, String> {
    let mut buf = [0u8; 1500];
    let (n, from) = if connected {
        s.send(payload).map_err(|e| format!("send: {e}"))?;
        let n = s.recv(&mut buf).map_err(|e| format!("recv: {e}"))?;
        let peer = s.peer_addr().map_err(|e| format!("getpeername: {e}"))?;
        (n, peer)
    } else {
        s.send_to(payload, target)
            .map_err(|e| format!("sendto: {e}"))?;
        s.recv_from(&mut buf)
            .map_err(|e| format!("recvfrom: {e}"))?
    };
    let text = String::from_utf8_lossy(&buf[..n]);
    Ok((parse_answer(&text)?, canonical(from).to_string()))
}

/// `<pod> <port> <client>` → (`<pod> port=<port>`, the client's IP as the
/// pod saw it).
fn parse_answer(text: &str) -> Result<(String, String), String> {
    let mut words = text.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(pod), Some(port), Some(client)) => {
            let seen = client
                .parse::<SocketAddr>()
                .map(|a| a.ip().to_string())
                .map_err(|_| format!("bad_answer:{text:?}"))?;
            Ok((format!("{pod} port={port}"), seen))
        }
        _ => Err(format!("bad_answer:{text:?}")),
    }
}
