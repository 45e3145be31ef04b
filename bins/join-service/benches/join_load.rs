//! `join_load`: the join service under load, against a plain TLS 1.3 gRPC unary baseline
//! measured the same way in the same run.
//!
//! The join service is the real `asterism-join-service` binary, a child process, so that its
//! CPU time and peak memory are its own. The key service (Unix socket) and the metadata
//! service run in this process, next to the joiners. Every joiner is a node with its own
//! address (`127.11.x.y`) and its own software-signed `tpm-quote` AK (evidence in the real
//! TPM format; the service pins every AK), and asks for one join ticket over a fresh aTLS
//! connection. Every run uses fresh nodes, so every ticket binds a new disk.
//!
//! Runs, each of K requests (after an unmeasured warm-up of 32):
//! * closed burst: all K start at once; latency from the common start;
//! * open loop at R/s: request i is scheduled at `start + i/R`, each on a fresh
//!   connection; latency from its *scheduled* start, so a server that falls behind is
//!   charged for the queueing it causes (no coordinated omission).
//!
//! The baseline is a tonic unary call over TLS 1.3 on a fresh connection (no client
//! authentication, ECDSA P-256 server certificate) to a server in a child process of its
//! own, with the same runtime and the same listen backlog as the join service
//! ([`asterism_join_service::LISTEN_BACKLOG`]).
//!
//! It prints, per run: achieved requests/s, p50 and p99 latency, and the CPU time per
//! request of the server process and of this process (the load generator, which shares
//! the machine); under it, how many CPUs the two kept busy, and for an open loop how many
//! its rate needs at those costs (near all of the machine's, the p99 is queueing, not the
//! service); the ratios join/baseline; and the join service's peak resident memory
//! (VmHWM) after all its runs.
//!
//! It also prints the floors of the two CPU-bound figures. The work a ticket must do that a
//! plain call does not (the evidence check, the CSR check, the kubelet certificate, the SSH
//! host certificate, the control plane's signature) is timed alone in this process, with the
//! same library calls the service makes. The floor of the server's CPU per ticket is the
//! plain call's plus that sum; the floor of the closed burst's ratio is the plain call's CPU
//! (server and load generator) over the join's with the server at its floor, both
//! processes sharing the machine's cores. The durable write, the key service's call and the
//! aTLS frames are not in the floor: they are what is left to cut.
//!
//! Run: `cargo bench -p asterism-join-service --profile release --bench join_load`
//! Environment: `JOIN_BENCH_JOINERS` (K, default 256), `JOIN_BENCH_RATES` (open-loop
//! rates per second, comma-separated, default `500,750,1000`), `JOIN_BENCH_SERVICE_BIN`
//! (another `asterism-join-service` binary to measure, e.g. an older build).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::indexing_slicing
)]

#[path = "../tests/common/mod.rs"]
mod common;

use asterism_atls::Issuer;
use asterism_metadata::{MetadataConfig, MetadataServer, Role};
use asterism_proto::kms::GetDataKeyRequest;
use asterism_proto::kms::api_client::ApiClient as KmsClient;
use asterism_soft_tpm::{SoftAk, SoftTpm};
use common::*;
use std::future::Future;
use std::io::BufRead as _;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Endpoint;

/// Unmeasured requests before the measured runs of each server.
const WARM_UP: usize = 32;
/// The argument that turns this program into the baseline server.
const BASELINE_SERVER_ARG: &str = "--baseline-server";

// --- the baseline server (a child process: this program with BASELINE_SERVER_ARG) ---

fn listen(addr: SocketAddr) -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    // The join service's listen backlog, so both servers take a burst alike.
    socket
        .listen(asterism_join_service::LISTEN_BACKLOG)
        .unwrap()
}

/// The baseline server: prints `listening <addr>` and serves until standard input closes.
fn baseline_server() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = listen("127.0.0.1:0".parse().unwrap());
        let addr = listener.local_addr().unwrap();
        // Handshakes run in tasks of their own, as the join service's aTLS acceptor does.
        asterism_testkit::tls_server::spawn_fixed_keys_server(listener).unwrap();
        println!("listening {addr}");
        // Until the parent closes our standard input.
        tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).unwrap_or(0) > 0 {}
        })
        .await
        .unwrap();
    });
}

// --- measuring ---

/// A server process whose CPU time and memory are read from `/proc`.
struct Server {
    child: Child,
}

/// User + system CPU time of process `pid` (or `self`) so far, in clock ticks of 1/100 s
/// (Linux's fixed `USER_HZ`).
fn cpu_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th
    // fields of the line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

impl Drop for Server {
    /// A run that panics does not leave its server behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    fn cpu(&self) -> Duration {
        cpu_of(&self.child.id().to_string())
    }

    /// The process's memory now, from `/proc/PID/status`.
    fn memory(&self) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap()
        };
        Memory {
            hwm_kib: field("VmHWM:"),
            rss_kib: field("VmRSS:"),
            anon_kib: field("RssAnon:"),
            file_kib: field("RssFile:"),
            threads: field("Threads:"),
        }
    }
}

/// A process's resident memory, split into what its heap and stacks hold (anonymous) and
/// what its mapped files hold (the binary's code and data, the shared libraries).
struct Memory {
    hwm_kib: u64,
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    threads: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |kib: u64| kib as f64 / 1024.0;
        write!(
            f,
            "peak (VmHWM) {:.1} MiB, now (VmRSS) {:.1} MiB = heap and stacks {:.1} MiB + mapped files {:.1} MiB; {} threads",
            mib(self.hwm_kib),
            mib(self.rss_kib),
            mib(self.anon_kib),
            mib(self.file_kib),
            self.threads
        )
    }
}

/// The result of one run.
struct Run {
    label: String,
    requests: usize,
    /// From the first scheduled start to the last completion.
    wall: Duration,
    /// Sorted.
    latencies: Vec<Duration>,
    server_cpu: Duration,
    /// This process: the clients (and, for the join service, the key and metadata
    /// services).
    generator_cpu: Duration,
    /// The arrivals per second asked for (open loop), or none (a burst).
    offered: Option<f64>,
}

impl Run {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i.min(self.latencies.len() - 1)]
    }

    fn print(&self) {
        let per_request = |d: Duration| d.as_secs_f64() * 1000.0 / self.requests as f64;
        println!(
            "  {:<30} {:>7.1}/s  p50 {:>9.2?}  p99 {:>9.2?}  CPU ms/request: server {:>5.2}, load generator {:>5.2}",
            self.label,
            self.per_second(),
            self.percentile(0.5),
            self.percentile(0.99),
            per_request(self.server_cpu),
            per_request(self.generator_cpu),
        );
        // Server and load generator share this machine: at `offered` per second, their
        // CPU per request says how many of its CPUs the rate needs. Near or above all of
        // them, latency is queueing.
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let both = self.server_cpu + self.generator_cpu;
        let busy = both.as_secs_f64() / self.wall.as_secs_f64();
        let needed = self.offered.map_or(String::new(), |rate| {
            format!(
                "; {rate}/s at these costs needs {:.2}",
                per_request(both) * rate / 1000.0
            )
        });
        println!("  {:<30} CPUs busy {busy:.2} of {cpus}{needed}", "");
    }
}

/// How requests arrive.
#[derive(Clone, Copy)]
enum Arrivals {
    /// All at once.
    Burst,
    /// Uniformly spaced at this many per second.
    Rate(f64),
}

/// Runs `jobs` (each one request on a fresh connection; they panic on failure) with the
/// given arrivals; the latency of each is measured from its scheduled start.
async fn measure<F>(label: String, server: &Server, arrivals: Arrivals, jobs: Vec<F>) -> Run
where
    F: Future<Output = ()> + Send + 'static,
{
    let requests = jobs.len();
    let cpu_before = (server.cpu(), cpu_of("self"));
    // Scheduled starts leave time to spawn every task first.
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let tasks: Vec<_> = jobs
        .into_iter()
        .enumerate()
        .map(|(i, job)| {
            let at = match arrivals {
                Arrivals::Burst => start,
                Arrivals::Rate(r) => start + Duration::from_secs_f64(i as f64 / r),
            };
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                job.await;
                let done = tokio::time::Instant::now();
                (done - at, done)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(requests);
    let mut end = start;
    for t in tasks {
        let (latency, done) = t.await.unwrap();
        latencies.push(latency);
        end = end.max(done);
    }
    latencies.sort();
    // The server's CPU time settles (logging, the last responses) a moment later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Run {
        label,
        requests,
        wall: end - start,
        latencies,
        server_cpu: server.cpu().saturating_sub(cpu_before.0),
        generator_cpu: cpu_of("self").saturating_sub(cpu_before.1),
        offered: match arrivals {
            Arrivals::Burst => None,
            Arrivals::Rate(r) => Some(r),
        },
    }
}

fn node_ip(i: usize) -> String {
    format!("127.11.{}.{}", i / 200, i % 200 + 1)
}

fn disk_uuid(i: usize) -> String {
    format!("{i:08x}-0000-4000-8000-000000000000")
}

/// The nodes of the load test: an attesting issuer and a join request each.
struct Nodes {
    issuers: Vec<Arc<dyn Issuer>>,
    requests: Vec<asterism_proto::join::IssueJoinTicketRequest>,
}

impl Nodes {
    fn jobs(
        &mut self,
        range: std::ops::Range<usize>,
        server: SocketAddr,
    ) -> Vec<impl Future<Output = ()> + Send + 'static + use<>> {
        range
            .map(|i| {
                let issuer = self.issuers[i].clone();
                let request = std::mem::take(&mut self.requests[i]);
                async move {
                    join(server, &node_ip(i), issuer, request)
                        .await
                        .unwrap_or_else(|e| panic!("node-{i}: {e:?}"));
                }
            })
            .collect()
    }
}

fn baseline_jobs(n: usize, url: &str) -> Vec<impl Future<Output = ()> + Send + 'static + use<>> {
    // Any server certificate, the handshake signature still checked, as aTLS does with
    // its ephemeral certificates.
    let connector = asterism_testkit::tls::h2_connector();
    (0..n)
        .map(|_| {
            let (url, connector) = (url.to_owned(), connector.clone());
            async move {
                let channel = Endpoint::from_shared(url)
                    .unwrap()
                    .connect_with_connector(connector)
                    .await
                    .unwrap();
                KmsClient::new(channel)
                    .get_data_key(GetDataKeyRequest {
                        data_key_id: "x".into(),
                        length: 32,
                    })
                    .await
                    .unwrap();
            }
        })
        .collect()
}

/// A ticket's required work beyond a plain call, each part timed alone: (what, time).
fn required_work(cluster: &Cluster) -> Vec<(&'static str, Duration)> {
    use asterism_attestation::{AkTrust, ReportData, TpmQuoteValidator, Validator};
    /// The least time of one call over 5 rounds of 200 calls.
    fn time(mut f: impl FnMut()) -> Duration {
        const CALLS: u32 = 200;
        (0..5)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..CALLS {
                    f();
                }
                start.elapsed() / CALLS
            })
            .min()
            .unwrap()
    }
    let tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
    let validator = TpmQuoteValidator::new(
        AkTrust::pinned([tpm.ak().fingerprint()]),
        zero_measurements().into_provider(),
    );
    let binding = ReportData::atls(asterism_attestation::Role::Client, &[7; 32]);
    let evidence = tpm.issue(&binding).unwrap();
    let request = join_request("node-floor", &node_ip(0), &disk_uuid(0), false);
    let csr = asterism_pki::KubeletCsr::parse(&request.certificate_request).unwrap();
    let host_key = asterism_pki::parse_wire_public_key(&request.host_public_key).unwrap();
    let principals = request.host_certificate_principals.clone();
    let ca = cluster.ca();
    let ssh_ca =
        asterism_pki::SshCa::from_seed(&asterism_kms::DataKey::new(vec![7; 32]).unwrap()).unwrap();
    let signer =
        asterism_kms::ControlPlaneSigner::new(&kms().control_plane_seed().unwrap()).unwrap();
    let now = std::time::SystemTime::now();
    vec![
        (
            "evidence check",
            time(|| {
                validator.validate(&evidence, &binding).unwrap();
            }),
        ),
        (
            "CSR check",
            time(|| {
                asterism_pki::KubeletCsr::parse(&request.certificate_request).unwrap();
            }),
        ),
        (
            "kubelet certificate",
            time(|| {
                ca.sign_kubelet(&csr, now).unwrap();
            }),
        ),
        (
            "SSH host certificate",
            time(|| {
                ssh_ca
                    .sign_host_certificate(&host_key, &principals, now)
                    .unwrap();
            }),
        ),
        (
            "control-plane signature",
            time(|| {
                let _ = signer.sign(
                    asterism_kms::Purpose::JoinTicket,
                    &asterism_kms::ChannelBinding([7; 32]),
                    &request.certificate_request,
                );
            }),
        ),
    ]
}

/// Prints the required work and the floors it sets (the module's doc says how).
fn print_floors(work: &[(&str, Duration)], join: &Run, baseline: &Run) {
    let per = |run: &Run, d: Duration| d.as_secs_f64() * 1000.0 / run.requests as f64;
    let parts: Vec<String> = work
        .iter()
        .map(|(what, d)| format!("{what} {:.1} us", d.as_secs_f64() * 1e6))
        .collect();
    let sum_ms: f64 = work.iter().map(|(_, d)| d.as_secs_f64() * 1000.0).sum();
    let base_server = per(baseline, baseline.server_cpu);
    let floor_server = base_server + sum_ms;
    let base_all = base_server + per(baseline, baseline.generator_cpu);
    let floor_all = floor_server + per(join, join.generator_cpu);
    println!(
        "  a ticket's required work beyond a plain call, each alone: {}; sum {:.3} ms",
        parts.join(", "),
        sum_ms
    );
    println!(
        "  floor, server CPU per ticket: {floor_server:.3} ms = {:.2}x the plain call's {base_server:.3} ms (measured {:.3} ms = {:.2}x)",
        floor_server / base_server,
        per(join, join.server_cpu),
        per(join, join.server_cpu) / base_server,
    );
    println!(
        "  floor, closed burst requests/s ratio: {:.2} (measured {:.3})",
        base_all / floor_all,
        join.per_second() / baseline.per_second(),
    );
}

fn stop(mut server: Server) {
    let status = asterism_children::status(
        Command::new("kill").args(["-TERM", &server.child.id().to_string()]),
    )
    .unwrap();
    assert!(status.success());
    let start = Instant::now();
    loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            assert!(s.success(), "the join service exited with {s:?}");
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the join service did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    if std::env::args().any(|a| a == BASELINE_SERVER_ARG) {
        return baseline_server();
    }
    let k: usize = std::env::var("JOIN_BENCH_JOINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let rates: Vec<f64> = std::env::var("JOIN_BENCH_RATES")
        .unwrap_or_else(|_| "500,750,1000".into())
        .split(',')
        .map(|r| r.trim().parse().expect("JOIN_BENCH_RATES: numbers"))
        .collect();
    let mut schedule = vec![("closed burst".to_owned(), Arrivals::Burst)];
    for &r in &rates {
        schedule.push((format!("open loop {r}/s"), Arrivals::Rate(r)));
    }
    let total = WARM_UP + k * schedule.len();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cluster = Cluster::start().await;
        // One worker instance per node, served by a metadata service of their own.
        let listener = TcpListener::bind("127.0.10.254:0").await.unwrap();
        let metadata_url = format!("http://{}", listener.local_addr().unwrap());
        let instances = (0..total)
            .map(|i| asterism_testkit::metadata::instance(&format!("node-{i}"), Role::Worker, node_ip(i)))
            .collect();
        tokio::spawn(
            MetadataServer::new(MetadataConfig {
                instances,
                init_secret_hash: String::new(),
            })
            .serve(listener, std::future::pending()),
        );

        let mut pins = Vec::new();
        let mut issuers: Vec<Arc<dyn Issuer>> = Vec::new();
        for _ in 0..total {
            let tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
            pins.push(tpm.ak().fingerprint().to_string());
            issuers.push(Arc::new(tpm));
        }
        let requests = (0..total)
            .map(|i| join_request(&format!("node-{i}"), &node_ip(i), &disk_uuid(i), false))
            .collect();
        let mut nodes = Nodes { issuers, requests };

        // The join service binary.
        let dir = cluster.dir.path();
        std::fs::write(dir.join("salt"), SALT).unwrap();
        std::fs::write(dir.join("measurements.json"), zero_measurements().to_json()).unwrap();
        let listen = format!("{CP}:{}", asterism_testkit::process::free_port(CP));
        let log = std::fs::File::create(dir.join("join-service.log")).unwrap();
        let binary = std::env::var_os("JOIN_BENCH_SERVICE_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_asterism-join-service").into());
        let mut command = Command::new(binary);
        command
            .args(["--listen", &listen])
            .arg("--measurements")
            .arg(dir.join("measurements.json"))
            .arg("--key-service")
            .arg(format!("unix:{}", cluster.key_socket.display()))
            .args(["--metadata-url", &metadata_url])
            .arg("--pki-dir")
            .arg(cluster.pki_dir())
            .arg("--measurement-salt-file")
            .arg(dir.join("salt"))
            .arg("--state-dir")
            .arg(cluster.state_dir());
        for pin in &pins {
            command.args(["--pinned-ak", pin]);
        }
        let service = Server {
            child: asterism_children::spawn(
                command
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log),
            )
            .unwrap(),
        };
        let addr: SocketAddr = listen.parse().unwrap();
        let start = Instant::now();
        while TcpStream::connect(addr).await.is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "the join service did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let mut join_runs = Vec::new();
        let idle = service.memory();
        let warm = nodes.jobs(0..WARM_UP, addr);
        measure("warm-up".into(), &service, Arrivals::Burst, warm).await;
        for (n, (label, arrivals)) in schedule.iter().enumerate() {
            let first = WARM_UP + n * k;
            let jobs = nodes.jobs(first..first + k, addr);
            join_runs.push(measure(format!("join, {label}"), &service, *arrivals, jobs).await);
        }
        let loaded = service.memory();
        stop(service);

        // The baseline server.
        let mut child = asterism_children::spawn(Command::new(std::env::current_exe().unwrap())
            .arg(BASELINE_SERVER_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()))
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = format!("http://{}", line.trim().strip_prefix("listening ").unwrap());
        let baseline = Server { child };
        let mut base_runs = Vec::new();
        measure("warm-up".into(), &baseline, Arrivals::Burst, baseline_jobs(WARM_UP, &url)).await;
        for (label, arrivals) in &schedule {
            let jobs = baseline_jobs(k, &url);
            base_runs.push(measure(format!("baseline, {label}"), &baseline, *arrivals, jobs).await);
        }
        let baseline_memory = baseline.memory();
        let mut baseline = baseline;
        drop(baseline.child.stdin.take());
        baseline.child.wait().unwrap();

        println!(
            "join_load: {k} requests per run on {} CPUs; join service: the asterism-join-service binary; key and metadata services in the load generator's process",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        );
        for r in join_runs.iter().chain(&base_runs) {
            r.print();
        }
        for (j, b) in join_runs.iter().zip(&base_runs) {
            println!(
                "  ratio join/baseline, {:<22} requests/s {:.3}  p50 {:.1}x  p99 {:.1}x",
                j.label.trim_start_matches("join, "),
                j.per_second() / b.per_second(),
                j.percentile(0.5).as_secs_f64() / b.percentile(0.5).as_secs_f64(),
                j.percentile(0.99).as_secs_f64() / b.percentile(0.99).as_secs_f64(),
            );
        }
        print_floors(&required_work(&cluster), &join_runs[0], &base_runs[0]);
        println!("  join service memory, started and idle: {idle}");
        println!("  join service memory after its runs:     {loaded}");
        println!("  baseline server memory after its runs:  {baseline_memory}");
    });
}
