//! Loopback connections for tests that play many network sources: a TCP connection from a
//! chosen local address (any of 127.0.0.0/8 on Linux), and whether the server closed one.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::{TcpSocket, TcpStream};

/// A TCP connection to `server` from the local address `from` (the port chosen by the
/// kernel), with Nagle's algorithm off as the services' clients dial.
pub async fn tcp_from(from: IpAddr, server: SocketAddr) -> io::Result<TcpStream> {
    let socket = match from {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(server).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// Whether the server closed `stream` within `wait`: end of stream or an error. What the
/// server sends meanwhile (HTTP/2 settings, say) is read and passed over; a stream still
/// open when `wait` is over is `false`.
pub async fn closed_within(stream: &mut (impl AsyncRead + Unpin), wait: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// The streams of `streams` the server has not closed, once at most `bound` are left or
/// `wait` has passed. A server may close connections a little after the client's connects
/// returned (they return once the kernel holds the connection, before the server accepts
/// it), so the streams still open are looked at again, 20 ms each, until the bound holds.
pub async fn open_after<S: AsyncRead + Unpin>(
    mut streams: Vec<S>,
    bound: usize,
    wait: Duration,
) -> Vec<S> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut open = Vec::with_capacity(streams.len());
        for mut stream in streams {
            if !closed_within(&mut stream, Duration::from_millis(20)).await {
                open.push(stream);
            }
        }
        streams = open;
        if streams.len() <= bound || tokio::time::Instant::now() >= deadline {
            return streams;
        }
    }
}
