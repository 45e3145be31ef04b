//! Shared helpers of the component tests, and of asterism-kubeadm's tests (which include
//! this file): a scripted HTTP server on 127.0.0.1 and tarballs built in the test (also
//! malicious ones).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// What the server does for one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with this body.
    Body(Vec<u8>),
    /// This status, empty body.
    Status(u16),
    /// Close the connection without an answer.
    Drop,
    /// 200 announcing `Content-Length: announced`, then only this body, then close.
    Partial(Vec<u8>, u64),
    /// 302 to this location.
    Redirect(String),
    /// Never answer (until the client gives up).
    Hang,
}

type Routes = Arc<Mutex<HashMap<String, (Vec<Reply>, usize)>>>;

/// A scripted HTTP/1.1 server: each path answers with its replies in order, the last one
/// repeating.
pub struct TestServer {
    pub addr: SocketAddr,
    routes: Routes,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    pub async fn start(routes: Vec<(&str, Vec<Reply>)>) -> Self {
        let routes: Routes = Arc::new(Mutex::new(
            routes
                .into_iter()
                .map(|(p, r)| (p.to_owned(), (r, 0)))
                .collect(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let r = routes.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move { answer(&r, req.uri().path()).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, routes, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many requests `path` got.
    pub fn hits(&self, path: &str) -> usize {
        self.routes.lock().unwrap().get(path).map_or(0, |(_, n)| *n)
    }
}

#[derive(Debug)]
struct Dropped;
impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped on purpose")
    }
}
impl std::error::Error for Dropped {}

async fn answer(routes: &Routes, path: &str) -> Result<Response<Full<Bytes>>, Dropped> {
    let reply = {
        let mut routes = routes.lock().unwrap();
        match routes.get_mut(path) {
            Some((replies, n)) => {
                let reply = replies.get(*n).or(replies.last()).cloned();
                *n += 1;
                reply.unwrap_or(Reply::Status(404))
            }
            None => Reply::Status(404),
        }
    };
    match reply {
        Reply::Body(b) => Ok(Response::new(Full::new(Bytes::from(b)))),
        Reply::Status(s) => Ok(Response::builder()
            .status(StatusCode::from_u16(s).unwrap())
            .body(Full::new(Bytes::new()))
            .unwrap()),
        Reply::Redirect(to) => Ok(Response::builder()
            .status(StatusCode::FOUND)
            .header("location", to)
            .body(Full::new(Bytes::new()))
            .unwrap()),
        Reply::Drop => Err(Dropped),
        Reply::Partial(b, announced) => Ok(Response::builder()
            .header("content-length", announced.to_string())
            .body(Full::new(Bytes::from(b)))
            .unwrap()),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Err(Dropped)
        }
    }
}

/// One tar entry, written with raw header fields so that malicious names survive.
pub enum Entry<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Fifo(&'a str),
}

/// A gzip-compressed tar of `entries`.
pub fn tarball(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, kind, data, mode, link): (&str, tar::EntryType, &[u8], u32, Option<&str>) =
            match e {
                Entry::File(n, d, m) => (n, tar::EntryType::Regular, d, *m, None),
                Entry::Dir(n, m) => (n, tar::EntryType::Directory, b"", *m, None),
                Entry::Symlink(n, t) => (n, tar::EntryType::Symlink, b"", 0o777, Some(t)),
                Entry::Hardlink(n, t) => (n, tar::EntryType::Link, b"", 0o644, Some(t)),
                Entry::Fifo(n) => (n, tar::EntryType::Fifo, b"", 0o644, None),
            };
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            old.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        h.set_cksum();
        builder.append(&h, data).unwrap();
    }
    let tar = builder.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    asterism_components::Sha256Hash::of(bytes).to_string()
}

/// Every file and directory under `root`, relative, sorted.
pub fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            }
        }
    }
    walk(root, root, &mut out);
    out.sort();
    out
}
