//! `nvmf-qos-agent`: the cluster agent (`run`) and the operator's commands on a
//! cluster (`cluster`, `host`, `show`), logging through `tracing` to stderr.
//! docs/cluster.md has a walkthrough.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use clap::{ArgAction, Parser, Subcommand};
use nvmf_qos_agent::admin::{self, AdminError};
use nvmf_qos_agent::agent::{Agent, AgentConfig, LogLine, RefusalLog, TickReport};
use nvmf_qos_agent::connect::EtcdOptions;
use nvmf_qos_agent::keys::check_name;
use nvmf_qos_agent::metrics::{self, AgentStatus};
use nvmf_qos_agent::peers::HttpPeers;
use nvmf_qos_agent::store::EtcdGateway;
use nvmf_qos_agent::target::SocketTarget;
use qos_core::cluster::{ClusterHost, DivideConfig};

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-qos-agent",
    version,
    about = "nvmf-qos cluster agent and cluster commands"
)]
struct Cli {
    /// etcd's client URL; for an etcd cluster, its members' URLs separated by commas
    /// (a call that finds its member down or without a leader goes to the next).
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:2379",
        env = "NVMF_QOS_ETCD"
    )]
    etcd: String,
    /// Timeout of each etcd call, milliseconds.
    #[arg(long, global = true, default_value_t = 500)]
    etcd_timeout_ms: u64,
    /// PEM certificate of the CA that signed etcd's server certificate (needed with an
    /// https:// URL).
    #[arg(long, global = true, env = "NVMF_QOS_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// PEM client certificate, for an etcd started with --client-cert-auth.
    #[arg(long, global = true, env = "NVMF_QOS_ETCD_CERT")]
    etcd_cert: Option<PathBuf>,
    /// PEM private key of --etcd-cert.
    #[arg(long, global = true, env = "NVMF_QOS_ETCD_KEY")]
    etcd_key: Option<PathBuf>,
    /// etcd user, for an etcd with authentication enabled.
    #[arg(long, global = true, env = "NVMF_QOS_ETCD_USER")]
    etcd_user: Option<String>,
    /// File whose first line is the password of --etcd-user (not on the command line,
    /// where every user of the machine could read it).
    #[arg(long, global = true, env = "NVMF_QOS_ETCD_PASSWORD_FILE")]
    etcd_password_file: Option<PathBuf>,
    /// More log: -v debug (a line every interval), -vv trace. RUST_LOG, when set,
    /// decides instead (e.g. RUST_LOG=nvmf_qos_agent=debug).
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the agent of one target (until SIGTERM or SIGINT, which make it leave).
    Run {
        #[arg(long)]
        cluster: String,
        /// This target's name in the cluster (unique per target).
        #[arg(long)]
        target: String,
        /// The target's JSON-RPC socket.
        #[arg(long, default_value = "/var/tmp/spdk.sock")]
        rpc_socket: PathBuf,
        /// The domain on the target that holds the cluster's hosts (create it first
        /// with `qos_domain_create`).
        #[arg(long)]
        domain: String,
        /// How often the agent reports, divides and applies, milliseconds (half the
        /// domain's period is a good choice).
        #[arg(long, default_value_t = 250)]
        interval_ms: u64,
        /// Lease time-to-live, seconds: how long a target whose agent went silent still
        /// counts as live.
        #[arg(long, default_value_t = 2)]
        lease_ttl_s: u64,
        /// Window over which each host's demand is measured, milliseconds (default:
        /// the domain's period).
        #[arg(long)]
        window_ms: Option<u64>,
        /// Serve /metrics (Prometheus) and /healthz on this address:port
        /// (127.0.0.1:9635, or 0.0.0.0:9635 for a remote Prometheus); off when not given.
        #[arg(long, env = "NVMF_QOS_AGENT_LISTEN")]
        listen: Option<String>,
        /// The address:port the other agents reach this one's --listen at, to read
        /// its handover report while etcd is away (default: the address --listen
        /// bound; give it when that is 0.0.0.0 or [::]). Without --listen the agent
        /// trades nothing while etcd is away.
        #[arg(long, env = "NVMF_QOS_AGENT_ADVERTISE")]
        advertise: Option<String>,
        /// How long reading a peer's handover report may take, milliseconds.
        #[arg(long, default_value_t = 100)]
        peer_timeout_ms: u64,
    },
    /// Create, update or delete a cluster.
    Cluster {
        #[command(subcommand)]
        op: ClusterOp,
    },
    /// Set or remove a host's cluster-wide contract.
    Host {
        #[command(subcommand)]
        op: HostOp,
    },
    /// Every host's contract, share and demand at each target, and the live targets.
    Show {
        #[arg(long)]
        cluster: String,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterOp {
    Create {
        #[arg(long)]
        cluster: String,
        /// Thousandths of each amount handed out evenly to all targets before the rest.
        #[arg(long, default_value_t = DivideConfig::default().floor_milli)]
        floor_milli: u32,
        /// Thousandths added to what a target where the host was not held served.
        #[arg(long, default_value_t = DivideConfig::default().headroom_milli)]
        headroom_milli: u32,
        /// Change the settings of an existing cluster.
        #[arg(long)]
        update: bool,
        /// The layout of the division in etcd: 3 (default for a new cluster), a record
        /// per target listing the hosts with a path there; 2, a record per target
        /// listing every host, which agents older than schema 3 read; 1, one record for
        /// the whole division, which agents older than schema 2 read. With --update,
        /// moves the cluster to it (upgrade every agent first; without it, --update
        /// keeps the cluster's).
        #[arg(long)]
        key_schema: Option<u32>,
    },
    Delete {
        #[arg(long)]
        cluster: String,
        /// Delete even with hosts set or targets live.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
enum HostOp {
    Set {
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        host_nqn: String,
        /// Reservation over the whole cluster, IOPS.
        #[arg(long, default_value_t = 0)]
        min_iops: u64,
        /// Limit over the whole cluster, IOPS.
        #[arg(long)]
        max_iops: Option<u64>,
        /// Reservation over the whole cluster, MiB/s (divided like IOPS).
        #[arg(long, default_value_t = 0)]
        min_mibps: u64,
        /// Limit over the whole cluster, MiB/s.
        #[arg(long)]
        max_mibps: Option<u64>,
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// With a reservation and no live target yet (right after `cluster create`, the
        /// agents join at their next interval): wait up to this many seconds for one.
        #[arg(long, default_value_t = 5)]
        wait_s: u64,
    },
    Remove {
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        host_nqn: String,
    },
}

/// Logs to stderr at info (`-v`: debug, `-vv`: trace), or as RUST_LOG says.
fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::LevelFilter;
    let level = match verbose {
        0 => LevelFilter::INFO,
        1 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours for a person at a terminal, none in journald or a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let opts = EtcdOptions {
        endpoint: cli.etcd.clone(),
        timeout: Duration::from_millis(cli.etcd_timeout_ms),
        ca: cli.etcd_ca.clone(),
        cert: cli.etcd_cert.clone(),
        key: cli.etcd_key.clone(),
        user: cli.etcd_user.clone(),
        password_file: cli.etcd_password_file.clone(),
    };
    let mut etcd = match EtcdGateway::connect(&opts) {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let res: Result<(), AdminError> = match cli.cmd {
        Cmd::Run {
            cluster,
            target,
            rpc_socket,
            domain,
            interval_ms,
            lease_ttl_s,
            window_ms,
            listen,
            advertise,
            peer_timeout_ms,
        } => {
            return run(
                &mut etcd,
                AgentConfig {
                    cluster,
                    target,
                    domain,
                    lease_ttl_s: lease_ttl_s.max(1),
                    window_ms,
                    handover_url: None,
                },
                Endpoints {
                    sock: rpc_socket,
                    listen,
                    advertise,
                    peer_timeout: Duration::from_millis(peer_timeout_ms.max(1)),
                },
                Duration::from_millis(interval_ms.max(10)),
            );
        }
        Cmd::Cluster { op } => match op {
            ClusterOp::Create {
                cluster,
                floor_milli,
                headroom_milli,
                update,
                key_schema,
            } => admin::cluster_create_with_schema(
                &mut etcd,
                &cluster,
                DivideConfig {
                    floor_milli,
                    headroom_milli,
                },
                update,
                key_schema,
            ),
            ClusterOp::Delete { cluster, force } => {
                admin::cluster_delete(&mut etcd, &cluster, force)
            }
        },
        Cmd::Host { op } => match op {
            HostOp::Set {
                cluster,
                host_nqn,
                min_iops,
                max_iops,
                min_mibps,
                max_mibps,
                weight,
                wait_s,
            } => admin::host_set_waiting(
                &mut etcd,
                &cluster,
                &host_nqn,
                ClusterHost {
                    reservation_iops: min_iops,
                    limit_iops: max_iops,
                    weight,
                    reservation_mibps: min_mibps,
                    limit_mibps: max_mibps,
                },
                Duration::from_secs(wait_s),
                Duration::from_millis(250),
            ),
            HostOp::Remove { cluster, host_nqn } => {
                admin::host_remove(&mut etcd, &cluster, &host_nqn)
            }
        },
        Cmd::Show { cluster, json } => admin::show(&mut etcd, &cluster).map(|v| {
            if json {
                println!("{}", serde_json::to_string_pretty(&v).expect("json"));
            } else {
                print!("{}", admin::show_text(&v));
            }
        }),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(2)
        }
    }
}

fn summary(r: &TickReport) -> String {
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|p| format!("{} {}", p.what, p.wall.as_millis()))
        .collect();
    format!(
        "target {} etcd {}{} shares #{} set {} removed {}{}{} (ms: {})",
        if r.target_ok { "ok" } else { "DOWN" },
        if r.etcd_ok {
            "ok"
        } else if r.etcd_reachable {
            "answers (lease not renewed: the target is down)"
        } else {
            "DOWN"
        },
        if r.leader { " leader" } else { "" },
        r.shares_seq.map_or("-".into(), |s| s.to_string()),
        r.set,
        r.removed,
        if r.refused.is_empty() {
            String::new()
        } else {
            format!(" refused {}", r.refused.len())
        },
        if r.etcd_ok {
            String::new()
        } else {
            format!(
                " handover: {} peers read{}, {} traded",
                r.peers_read,
                if r.peers_other_division > 0 {
                    format!(" ({} on another division)", r.peers_other_division)
                } else {
                    String::new()
                },
                r.traded
            )
        },
        phases.join(", ")
    )
}

/// Where a running agent talks: its target's socket, its HTTP listener, and how its
/// peers reach that listener.
struct Endpoints {
    sock: PathBuf,
    listen: Option<String>,
    advertise: Option<String>,
    peer_timeout: Duration,
}

/// The URL the peers read this agent's handover report at: `advertise`, or the address
/// the listener bound unless that is a wildcard (the peers cannot reach it).
fn handover_url(bound: SocketAddr, advertise: Option<&str>) -> Result<String, String> {
    match advertise {
        Some(a) => Ok(format!("http://{a}/handover")),
        None if bound.ip().is_unspecified() => Err(format!(
            "--listen bound {bound}, which the other agents cannot reach: give --advertise \
             ADDR:PORT so they can read this agent's handover report while etcd is away"
        )),
        None => Ok(format!("http://{bound}/handover")),
    }
}

fn run(
    etcd: &mut EtcdGateway,
    mut cfg: AgentConfig,
    ends: Endpoints,
    interval: Duration,
) -> ExitCode {
    for (what, name) in [("cluster", &cfg.cluster), ("target", &cfg.target)] {
        if let Err(e) = check_name(what, name) {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            tracing::error!("cannot watch signal {sig}: {e}");
            return ExitCode::from(2);
        }
    }
    let status = Arc::new(Mutex::new(AgentStatus::new(&cfg)));
    if let Some(addr) = &ends.listen {
        match metrics::serve(addr, Arc::clone(&status)) {
            Ok(bound) => {
                tracing::info!("serving /metrics, /healthz and /handover on http://{bound}");
                match handover_url(bound, ends.advertise.as_deref()) {
                    Ok(url) => cfg.handover_url = Some(url),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            Err(e) => {
                tracing::error!("{e}");
                return ExitCode::from(2);
            }
        }
    }
    let mut peers = HttpPeers {
        timeout: ends.peer_timeout,
    };
    let sock = ends.sock;
    tracing::info!(
        cluster = cfg.cluster,
        target = cfg.target,
        domain = cfg.domain,
        "agent started: target socket {}, etcd {}, every {} ms",
        sock.display(),
        etcd.endpoints().join(","),
        interval.as_millis()
    );
    let mut tgt = SocketTarget::new(sock, Duration::from_secs(2));
    let mut agent = Agent::new(cfg);
    let mut refusals = RefusalLog::default();
    let mut last = String::new();
    let started = Instant::now();
    let mut next = started;
    while !stop.load(Ordering::Relaxed) {
        let r = agent.tick(
            started.elapsed().as_millis() as u64,
            etcd,
            &mut tgt,
            &mut peers,
        );
        {
            let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
            s.record(&r, agent.holds_lease(), Instant::now(), SystemTime::now());
            s.set_handover(&agent.handover_report());
        }
        let line = summary(&r);
        // The shares number moves every division: report changes of state and errors
        // at info (warn when something is down), every interval at debug.
        let state = format!(
            "{} {} {} {}",
            r.target_ok,
            r.etcd_ok,
            r.leader,
            r.errors.join("; ")
        );
        if state != last || r.set + r.removed > 0 {
            if r.target_ok && r.etcd_ok {
                tracing::info!("{line}");
            } else {
                tracing::warn!("{line}");
            }
            for e in &r.errors {
                tracing::warn!("  {e}");
            }
        } else {
            tracing::debug!("{line}");
        }
        for l in refusals.note(&r, Instant::now()) {
            match l {
                LogLine::Warn(l) => tracing::warn!("{l}"),
                LogLine::Info(l) => tracing::info!("{l}"),
            }
        }
        last = state;
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    match agent.leave(etcd) {
        Ok(()) => tracing::info!("left the cluster (lease revoked)"),
        Err(e) => tracing::warn!("leaving: {e}; the lease expires on its own"),
    }
    ExitCode::SUCCESS
}
