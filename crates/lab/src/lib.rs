//! The reference case on one machine: a "server host" network namespace joined to the
//! current namespace by a veth pair, with real nginx (good on :80, latency on :8080) or the
//! built-in fault server inside it.
//!
//! API CONTRACT (other crates' tests code against this; keep it stable):
//! ```text
//! let lab = Lab::up(&LabOptions::new("mytest-1234"))?;   // guard: Drop tears it down
//! lab.good_url()     // "http://10.x.y.2:80/"     (good_addr(): SocketAddr)
//! lab.latency_url()  // "http://10.x.y.2:8080/"   (latency_addr(): SocketAddr)
//! lab.server_addr()  // Ipv4Addr inside the namespace
//! lab.client_addr()  // Ipv4Addr on this namespace's veth end
//! lab.netns()        // NetNs::Named(..) of the server host
//! lab.client_iface() // veth name in the current namespace (capture here)
//! lab.fix()? / lab.unfix()?   // latency server: tcp_nodelay on / off, reloaded
//! Lab::down("name")?          // idempotent teardown by name (CLI `lab down`)
//! serve::Server::spawn(serve::ServeOptions{..})  // in-process fault server (tests)
//! lab.start_builtin(exe, port, &opts)? // extra `EXE serve` process in the namespace -> pid
//! lab.shape(rate_bps, burst, limit)?   // tbf on the server->client direction; unshape()
//! lab.drop_percent(pct)?               // nftables: drop pct% of server->client TCP
//! lab.server_pids("latency")          // nginx workers / serve pid owning the sockets
//! probe_client::get_sequence(addr, n, timeout)? // n keep-alive GETs, timed
//! ```
//! Options: `LabOptions::new(name).server(ServerKind::Builtin)` runs the built-in server
//! on threads of this process instead of nginx (`BuiltinProcess(exe)`: detached
//! `EXE serve` processes); `.nginx(path)` another nginx binary. A missing nginx falls back
//! to the built-in server with a note in [`Lab::notes`].
//!
//! State lives in `/run/lagtrace/labs/<name>/` (configs, logs, `state.json`) so another
//! process (`lagtrace lab status|fix|unfix|down`) can act on a lab.
#![deny(missing_docs)]

mod error;
pub mod probe_client;
pub mod serve;
mod sys;

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lagtrace_netns::NetNs;
use serde::{Deserialize, Serialize};

pub use error::{Error, Result};
pub use sys::check_privileges;

use error::{Context, bail};

/// Where labs keep their state.
pub const STATE_ROOT: &str = "/run/lagtrace/labs";
/// The Debian nginx binary.
pub const NGINX: &str = "/usr/sbin/nginx";
/// Debian's stock page, served by both nginx servers.
pub const NGINX_ROOT: &str = "/usr/share/nginx/html";
/// Port of the good server.
pub const GOOD_PORT: u16 = 80;
/// Port of the latency server.
pub const LATENCY_PORT: u16 = 8080;
/// Prefix of the lab's namespace name: `lt-<name>`.
pub const NETNS_PREFIX: &str = "lt-";

/// Which servers run in the lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    /// Real nginx from the Debian package (falls back to `Builtin` when nginx is missing).
    Nginx,
    /// The built-in server on threads of this process, bound inside the namespace; it
    /// lives as long as the [`Lab`] guard (for tests).
    Builtin,
    /// `EXE serve` processes started detached inside the namespace (for the CLI, whose
    /// process exits while the lab stays up).
    BuiltinProcess(PathBuf),
}

/// How to bring a lab up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabOptions {
    /// Lab name: `[A-Za-z0-9_-]`, at most 24 characters.
    pub name: String,
    /// The servers.
    pub server: ServerKind,
    /// The nginx binary ([`NGINX`] unless changed).
    pub nginx: PathBuf,
}

impl LabOptions {
    /// nginx servers in a lab called `name`.
    pub fn new(name: &str) -> LabOptions {
        LabOptions {
            name: name.to_string(),
            server: ServerKind::Nginx,
            nginx: PathBuf::from(NGINX),
        }
    }

    /// Same, with another nginx binary.
    pub fn nginx(mut self, path: &Path) -> LabOptions {
        self.nginx = path.to_path_buf();
        self
    }

    /// Same, with another server kind.
    pub fn server(mut self, server: ServerKind) -> LabOptions {
        self.server = server;
        self
    }
}

/// One server of the lab, as recorded in its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServerInfo {
    /// `good`, `latency`, or `extra` for [`Lab::start_builtin`].
    pub role: String,
    /// `nginx`, `builtin` (in-process) or `builtin-process`.
    pub kind: String,
    /// TCP port inside the namespace.
    pub port: u16,
    /// Process id (nginx master, `lagtrace serve`), none for in-process servers.
    pub pid: Option<u32>,
    /// nginx prefix directory (config, pid, logs), if nginx.
    pub prefix: Option<PathBuf>,
    /// nginx config file, if nginx.
    pub config: Option<PathBuf>,
    /// Log file (nginx error log or the serve process's stderr).
    pub log: Option<PathBuf>,
    /// Whether the latency fix (tcp_nodelay on) is applied (latency nginx only).
    pub fixed: bool,
}

/// Everything about a lab, as written to `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabState {
    /// Lab name.
    pub name: String,
    /// Namespace of the server host (`lt-<name>`).
    pub netns: String,
    /// veth end in the current namespace.
    pub client_iface: String,
    /// veth end inside the lab namespace.
    pub server_iface: String,
    /// Address of `client_iface`.
    pub client_addr: Ipv4Addr,
    /// Address of `server_iface`.
    pub server_addr: Ipv4Addr,
    /// Prefix length of the link's subnet.
    pub prefix_len: u8,
    /// The servers.
    pub servers: Vec<ServerInfo>,
    /// Notes for the user (e.g. the fallback from nginx to the built-in server).
    pub notes: Vec<String>,
    /// Process that brought the lab up.
    pub owner_pid: u32,
    /// Inode of the namespace: identifies the lab's processes even after its name is gone.
    #[serde(default)]
    pub netns_inode: u64,
}

impl LabState {
    /// `http://ADDR:PORT/` of the server with that role.
    pub fn url(&self, role: &str) -> Option<String> {
        self.servers
            .iter()
            .find(|s| s.role == role)
            .map(|s| format!("http://{}:{}/", self.server_addr, s.port))
    }

    /// The state directory of this lab.
    pub fn dir(&self) -> PathBuf {
        state_dir(&self.name)
    }
}

/// What `lagtrace lab status --json` prints (inside the [`lagtrace_model::Envelope`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabStatusReport {
    /// The labs that are up.
    pub labs: Vec<LabStatus>,
    /// Namespaces named like a lab's (`lt-<name>`) with no lab state: left by a crash.
    pub orphan_namespaces: Vec<String>,
}

/// One lab in [`LabStatusReport`]: its state and whether each server answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabStatus {
    /// The lab's state, as `lab up --json` printed it.
    #[serde(flatten)]
    pub state: LabState,
    /// Per server of `state.servers`, in order: whether a TCP connect succeeded.
    pub answering: Vec<bool>,
}

/// A running lab. Dropping it tears everything down (also during a panic).
#[derive(Debug)]
pub struct Lab {
    name: String,
    netns: String,
    client_iface: String,
    server_iface: String,
    client_addr: Ipv4Addr,
    server_addr: Ipv4Addr,
    state: Mutex<LabState>,
    inproc: Mutex<Vec<(String, serve::Server)>>,
    /// When false, Drop leaves the lab up (the CLI's `lab up`).
    teardown_on_drop: bool,
}

/// The state directory of lab `name`.
pub fn state_dir(name: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(name)
}

/// The namespace name of lab `name`.
pub fn netns_name(name: &str) -> String {
    format!("{NETNS_PREFIX}{name}")
}

/// Checks a lab name: `[A-Za-z0-9_-]`, 1 to 24 characters.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 24 {
        bail!("lab name {name:?} must be 1 to 24 characters long");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        bail!("lab name {name:?} may only contain letters, digits, '_' and '-'");
    }
    Ok(())
}

fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Lab {
    /// Brings a lab up: namespace, veth pair, addresses, servers. Errors name what failed;
    /// anything created before the failure is removed again.
    pub fn up(opts: &LabOptions) -> Result<Lab> {
        validate_name(&opts.name)?;
        check_privileges()?;
        let name = opts.name.as_str();
        let ns = netns_name(name);
        let dir = state_dir(name);
        if dir.exists() || NetNs::Named(ns.clone()).exists() {
            bail!("lab {name:?} is already up; run `lagtrace lab down --name {name}` first");
        }
        let h = fnv1a(name);
        let tag = format!("{:08x}", h as u32);
        let client_iface = format!("lt{tag}c");
        let server_iface = format!("lt{tag}s");
        // `ip netns add` fails if the name exists: it is the lock against a concurrent `up`.
        sys::ip(&["netns", "add", &ns]).with_context(|| {
            format!("creating network namespace {ns} (is lab {name:?} being brought up elsewhere?)")
        })?;
        let state = LabState {
            name: name.to_string(),
            netns: ns.clone(),
            client_iface: client_iface.clone(),
            server_iface: server_iface.clone(),
            client_addr: Ipv4Addr::UNSPECIFIED,
            server_addr: Ipv4Addr::UNSPECIFIED,
            prefix_len: 30,
            servers: Vec::new(),
            notes: Vec::new(),
            owner_pid: std::process::id(),
            netns_inode: 0,
        };
        let mut lab = Lab::from_state(state, true);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (client_addr, server_addr) = sys::pick_subnet(h)?;
        lab.client_addr = client_addr;
        lab.server_addr = server_addr;
        {
            let mut st = lab.st();
            st.client_addr = client_addr;
            st.server_addr = server_addr;
        }
        lab.save()?;
        lab.link(&ns, &client_iface, &server_iface)?;
        lab.save()?;
        lab.start_servers(opts, &ns)?;
        Ok(lab)
    }

    /// The veth pair between this host and the namespace, addressed and up (IPv6 off).
    fn link(&mut self, ns: &str, client_iface: &str, server_iface: &str) -> Result<()> {
        sys::ip(&[
            "link",
            "add",
            client_iface,
            "type",
            "veth",
            "peer",
            "name",
            server_iface,
            "netns",
            ns,
        ])?;
        sys::disable_ipv6(None, client_iface);
        sys::ip(&[
            "addr",
            "add",
            &format!("{}/30", self.client_addr),
            "dev",
            client_iface,
        ])?;
        sys::ip(&["link", "set", client_iface, "up"])?;
        sys::ip(&["-n", ns, "link", "set", "lo", "up"])?;
        self.st().netns_inode = self.netns().inode().unwrap_or(0);
        sys::disable_ipv6(Some(ns), server_iface);
        sys::ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/30", self.server_addr),
            "dev",
            server_iface,
        ])?;
        sys::ip(&["-n", ns, "link", "set", server_iface, "up"])?;
        Ok(())
    }

    /// The good and latency servers: nginx, or the built-in server (in this process or as
    /// `lagtrace serve` processes) when nginx is not installed.
    fn start_servers(&mut self, opts: &LabOptions, ns: &str) -> Result<()> {
        let mut kind = opts.server.clone();
        if kind == ServerKind::Nginx && !opts.nginx.exists() {
            let fallback = match std::env::current_exe() {
                Ok(exe) if exe.file_name().is_some_and(|n| n == "lagtrace") => {
                    ServerKind::BuiltinProcess(exe)
                }
                _ => ServerKind::Builtin,
            };
            self.st().notes.push(format!(
                "nginx not found at {} (Debian package nginx-light); using the built-in server",
                opts.nginx.display()
            ));
            kind = fallback;
        }
        match kind {
            ServerKind::Nginx => {
                self.start_nginx(&opts.nginx, "good", GOOD_PORT, false)?;
                self.start_nginx(&opts.nginx, "latency", LATENCY_PORT, false)?;
            }
            ServerKind::Builtin => {
                for (role, port, nodelay) in
                    [("good", GOOD_PORT, true), ("latency", LATENCY_PORT, false)]
                {
                    let o = builtin_options(
                        self.server_addr,
                        port,
                        nodelay,
                        NetNs::Named(ns.to_string()),
                    );
                    let s = serve::Server::spawn(o)
                        .with_context(|| format!("starting the built-in {role} server"))?;
                    self.inproc().push((role.to_string(), s));
                    self.st().servers.push(ServerInfo {
                        role: role.into(),
                        kind: "builtin".into(),
                        port,
                        pid: None,
                        prefix: None,
                        config: None,
                        log: None,
                        fixed: false,
                    });
                    self.save()?;
                }
            }
            ServerKind::BuiltinProcess(exe) => {
                for (role, port, nodelay) in
                    [("good", GOOD_PORT, true), ("latency", LATENCY_PORT, false)]
                {
                    let o = builtin_options(Ipv4Addr::UNSPECIFIED, port, nodelay, NetNs::Current);
                    self.spawn_serve(&exe, role, &o)?;
                }
            }
        }
        Ok(())
    }

    /// Re-opens a lab brought up by another process, for `fix`/`unfix`/`status`. The
    /// returned guard does not tear the lab down on drop.
    pub fn open(name: &str) -> Result<Lab> {
        validate_name(name)?;
        let state = read_state(name)?.with_context(|| {
            format!(
                "lab {name:?} is not up (no {})",
                state_dir(name).join("state.json").display()
            )
        })?;
        Ok(Lab::from_state(state, false))
    }

    fn from_state(state: LabState, teardown_on_drop: bool) -> Lab {
        Lab {
            name: state.name.clone(),
            netns: state.netns.clone(),
            client_iface: state.client_iface.clone(),
            server_iface: state.server_iface.clone(),
            client_addr: state.client_addr,
            server_addr: state.server_addr,
            state: Mutex::new(state),
            inproc: Mutex::new(Vec::new()),
            teardown_on_drop,
        }
    }

    fn st(&self) -> MutexGuard<'_, LabState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn inproc(&self) -> MutexGuard<'_, Vec<(String, serve::Server)>> {
        self.inproc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Leaves the lab up when this guard is dropped (the CLI's `lab up`).
    pub fn keep(mut self) -> LabState {
        self.teardown_on_drop = false;
        self.state()
    }

    /// Everything about the lab (a snapshot).
    pub fn state(&self) -> LabState {
        self.st().clone()
    }

    /// Lab name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// URL of the good server (`http://ADDR:80/`).
    pub fn good_url(&self) -> String {
        format!("http://{}:{GOOD_PORT}/", self.server_addr)
    }

    /// URL of the latency server (`http://ADDR:8080/`).
    pub fn latency_url(&self) -> String {
        format!("http://{}:{LATENCY_PORT}/", self.server_addr)
    }

    /// Socket address of the good server.
    pub fn good_addr(&self) -> SocketAddr {
        SocketAddr::from((self.server_addr, GOOD_PORT))
    }

    /// Socket address of the latency server.
    pub fn latency_addr(&self) -> SocketAddr {
        SocketAddr::from((self.server_addr, LATENCY_PORT))
    }

    /// The server host's address (inside the namespace).
    pub fn server_addr(&self) -> Ipv4Addr {
        self.server_addr
    }

    /// The client's address (veth end in the current namespace).
    pub fn client_addr(&self) -> Ipv4Addr {
        self.client_addr
    }

    /// The server host's namespace.
    pub fn netns(&self) -> NetNs {
        NetNs::Named(self.netns.clone())
    }

    /// veth end in the current namespace: capture here to see the lab's traffic.
    pub fn client_iface(&self) -> &str {
        &self.client_iface
    }

    /// veth end inside the namespace.
    pub fn server_iface(&self) -> &str {
        &self.server_iface
    }

    /// Notes for the user (fallbacks).
    pub fn notes(&self) -> Vec<String> {
        self.st().notes.clone()
    }

    /// Processes that own the accepted sockets of the server with `role` (`good`, `latency`,
    /// `extra`): nginx's workers, the `serve` process, or this process for the in-process
    /// server. Empty if there is no such server. For `sockets` tests.
    pub fn server_pids(&self, role: &str) -> Vec<u32> {
        let st = self.st();
        let mut out = Vec::new();
        for s in st.servers.iter().filter(|s| s.role == role) {
            match (s.kind.as_str(), s.pid) {
                ("nginx", Some(master)) => out.extend(sys::children(master)),
                (_, Some(pid)) => out.push(pid),
                (_, None) => out.push(std::process::id()),
            }
        }
        out
    }

    /// Requests answered by the in-process built-in server with `role`, if it is one.
    pub fn inproc_requests(&self, role: &str) -> Option<u64> {
        self.inproc()
            .iter()
            .find(|(r, _)| r == role)
            .map(|(_, s)| s.requests())
    }

    /// Applies the fix to the latency server, exactly as `diagnose` words it: its nginx
    /// config's `tcp_nodelay off;` line becomes `tcp_nodelay on;` (nothing else changes),
    /// nginx is reloaded, and this waits until the new workers serve. Returns the line it
    /// changed. The built-in server kinds have no config: the latency server is restarted
    /// with TCP_NODELAY on, and `None` is returned.
    pub fn fix(&self) -> Result<Option<ConfigEdit>> {
        self.set_latency_nodelay(true)
    }

    /// Undoes [`Lab::fix`]: `tcp_nodelay off;` again.
    pub fn unfix(&self) -> Result<Option<ConfigEdit>> {
        self.set_latency_nodelay(false)
    }

    fn set_latency_nodelay(&self, on: bool) -> Result<Option<ConfigEdit>> {
        let mut edit = None;
        check_privileges()?;
        let info = self
            .st()
            .servers
            .iter()
            .find(|s| s.role == "latency")
            .cloned()
            .context("this lab has no latency server")?;
        match info.kind.as_str() {
            "nginx" => {
                let prefix = info.prefix.clone().context("nginx server without prefix")?;
                let config = info.config.clone().context("nginx server without config")?;
                let pid = info.pid.context("nginx server without pid")?;
                let text = fs::read_to_string(&config)
                    .with_context(|| format!("reading {}", config.display()))?;
                let (text, e) = set_directive(&text, "tcp_nodelay", if on { "on" } else { "off" });
                fs::write(&config, text)
                    .with_context(|| format!("writing {}", config.display()))?;
                edit = Some(ConfigEdit {
                    file: config.clone(),
                    ..e
                });
                let before = sys::children(pid);
                sys::signal(pid, libc::SIGHUP)
                    .with_context(|| format!("reloading nginx (pid {pid})"))?;
                sys::wait_reload(pid, &before, Duration::from_secs(10)).with_context(|| {
                    format!(
                        "nginx did not reload; {}",
                        sys::tail(&prefix.join("error.log"), 5)
                    )
                })?;
            }
            "builtin" => {
                let mut inproc = self.inproc();
                if let Some(p) = inproc.iter().position(|(r, _)| r == "latency") {
                    let (_, mut old) = inproc.remove(p);
                    old.stop();
                    drop(old);
                    let o = builtin_options(self.server_addr, LATENCY_PORT, on, self.netns());
                    let s = spawn_retrying(o).context("restarting the built-in latency server")?;
                    inproc.insert(p, ("latency".to_string(), s));
                } else {
                    bail!(
                        "the built-in servers of lab {} run inside process {}; fix them from there",
                        self.name,
                        self.st().owner_pid
                    );
                }
            }
            _ => {
                // builtin-process: stop it and start another with the other TCP_NODELAY.
                if let Some(pid) = info.pid {
                    sys::kill_wait(pid, Duration::from_secs(3));
                }
                self.st().servers.retain(|s| s.role != "latency");
                let exe = sys::exe_of_state(&info)
                    .unwrap_or(std::env::current_exe().context("finding this executable")?);
                let o = builtin_options(Ipv4Addr::UNSPECIFIED, LATENCY_PORT, on, NetNs::Current);
                self.spawn_serve(&exe, "latency", &o)?;
            }
        }
        if let Some(s) = self.st().servers.iter_mut().find(|s| s.role == "latency") {
            s.fixed = on;
        }
        self.save()?;
        Ok(edit)
    }

    /// Starts an extra `EXE serve` process inside the lab's namespace on `port` (all
    /// addresses) with `opts` (its `listen` and `netns` are ignored). The lab's teardown
    /// kills it. Returns its pid once the port answers.
    pub fn start_builtin(&self, exe: &Path, port: u16, opts: &serve::ServeOptions) -> Result<u32> {
        let mut o = opts.clone();
        o.listen = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        o.netns = NetNs::Current;
        self.spawn_serve(exe, "extra", &o)
    }

    /// Shapes the server->client direction with tbf on the namespace's veth egress:
    /// `rate_bps` bits per second, `burst` and `limit` in bytes.
    pub fn shape(&self, rate_bps: u64, burst: u32, limit: u32) -> Result<()> {
        sys::run(
            "tc",
            &[
                "-n",
                &self.netns,
                "qdisc",
                "replace",
                "dev",
                &self.server_iface,
                "root",
                "tbf",
                "rate",
                &format!("{rate_bps}bit"),
                "burst",
                &burst.to_string(),
                "limit",
                &limit.to_string(),
            ],
        )
    }

    /// Removes the shaping of [`Lab::shape`] (no error if there is none).
    pub fn unshape(&self) -> Result<()> {
        let _ = sys::run(
            "tc",
            &[
                "-n",
                &self.netns,
                "qdisc",
                "del",
                "dev",
                &self.server_iface,
                "root",
            ],
        );
        Ok(())
    }

    /// Drops `pct` percent (0..=100) of the server->client TCP packets
    /// (`numgen random mod 100 < pct`); 0 removes the rule.
    ///
    /// The drop happens where the wire would lose them: at the ingress of the client-side
    /// veth, with an nftables `netdev` table bound to that device in the current namespace
    /// (`lagtrace_lab_<tag>`, removed with the lab). Dropping in the lab namespace's own
    /// output path would not do: the server's TCP sees a local send failure and quietly
    /// sends again, with no retransmission on the wire.
    pub fn drop_percent(&self, pct: u8) -> Result<()> {
        self.drop_percent_of(pct, "meta l4proto tcp")
    }

    /// As [`Lab::drop_percent`], of the server's SYN-ACKs only: its connections' answers
    /// are lost on the way to the client, after they left the server (and its capture).
    pub fn drop_syn_acks_percent(&self, pct: u8) -> Result<()> {
        self.drop_percent_of(pct, "tcp flags & (syn | ack) == syn | ack")
    }

    /// As [`Lab::drop_percent`], of the server->client packets that `matches` (an nft
    /// match, e.g. `ip length > 1000` for full-size data segments).
    pub fn drop_percent_of(&self, pct: u8, matches: &str) -> Result<()> {
        if pct > 100 {
            bail!("drop percentage {pct} is above 100");
        }
        let table = drop_table(&self.name);
        sys::delete_nft_table(&table);
        if pct == 0 {
            return Ok(());
        }
        let rules = format!(
            "table netdev {table} {{\n  chain server_to_client {{\n    type filter hook ingress device \"{}\" priority 0; policy accept;\n    ip saddr {} {matches} numgen random mod 100 < {pct} counter drop\n  }}\n}}\n",
            self.client_iface, self.server_addr
        );
        let file = state_dir(&self.name).join("drop.nft");
        fs::write(&file, rules).with_context(|| format!("writing {}", file.display()))?;
        sys::run("nft", &["-f", &file.to_string_lossy()])
    }

    /// Tears the lab `name` down: its processes, namespace (and so the veth pair), and
    /// state directory. Idempotent: a lab that is not up is not an error.
    pub fn down(name: &str) -> Result<()> {
        validate_name(name)?;
        // Without the capabilities teardown fails half-way (or, for a lab that is not up,
        // would claim success it could not have had): say what is missing up front.
        check_privileges()?;
        let state = read_state(name).ok().flatten();
        teardown(name, state.as_ref())
    }

    /// Labs that are up (from their state directories, plus orphaned `lt-*` namespaces).
    pub fn list() -> Vec<LabState> {
        let mut out = Vec::new();
        if let Ok(rd) = fs::read_dir(STATE_ROOT) {
            for e in rd.flatten() {
                if let Some(n) = e.file_name().to_str()
                    && let Ok(Some(s)) = read_state(n)
                {
                    out.push(s);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Names of `lt-*` namespaces that have no state directory (left by a crash).
    pub fn orphans() -> Vec<String> {
        lagtrace_netns::list_named()
            .into_iter()
            .filter_map(|n| n.strip_prefix(NETNS_PREFIX).map(str::to_string))
            .filter(|n| !state_dir(n).join("state.json").exists())
            .collect()
    }

    fn save(&self) -> Result<()> {
        let dir = state_dir(&self.name);
        let tmp = dir.join("state.json.tmp");
        let json = serde_json::to_vec_pretty(&*self.st()).context("serializing the lab state")?;
        fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, dir.join("state.json"))
            .with_context(|| format!("renaming {}", tmp.display()))?;
        Ok(())
    }

    fn start_nginx(&self, nginx: &Path, role: &str, port: u16, fixed: bool) -> Result<()> {
        let prefix = state_dir(&self.name).join(format!("nginx-{role}"));
        let logs = prefix.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let config = prefix.join("nginx.conf");
        let latency = role == "latency";
        fs::write(&config, nginx_config(&prefix, port, latency, fixed))
            .with_context(|| format!("writing {}", config.display()))?;
        let log = prefix.join("error.log");
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(nginx)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&config)
            .arg("-e")
            .arg(&log)
            .stdin(std::process::Stdio::null())
            // Its own process group: a terminal's Ctrl-C (sent to the foreground group) must
            // not kill nginx while it starts; the caller decides what an interrupt means.
            .process_group(0)
            .output()
            .context("running ip netns exec nginx")?;
        let pidfile = prefix.join("nginx.pid");
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', " | ");
            let why = if fs::metadata(&log).is_ok_and(|m| m.len() > 0) {
                sys::tail(&log, 5)
            } else {
                format!("its output: {stderr}")
            };
            bail!(
                "nginx ({role}, port {port}) failed to start ({}); {why}",
                out.status
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Some(p) = fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                break p;
            }
            if Instant::now() > deadline {
                bail!(
                    "nginx ({role}) wrote no pid file {}; {}",
                    pidfile.display(),
                    sys::tail(&log, 5)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.st().servers.push(ServerInfo {
            role: role.into(),
            kind: "nginx".into(),
            port,
            pid: Some(pid),
            prefix: Some(prefix),
            config: Some(config),
            log: Some(log.clone()),
            fixed,
        });
        self.save()?;
        sys::wait_answer(
            SocketAddr::from((self.server_addr, port)),
            Duration::from_secs(10),
            Some(pid),
        )
        .with_context(|| {
            format!(
                "nginx ({role}) does not answer on port {port}; {}",
                sys::tail(&log, 5)
            )
        })
    }

    fn spawn_serve(&self, exe: &Path, role: &str, o: &serve::ServeOptions) -> Result<u32> {
        let port = o.listen.port();
        let log = state_dir(&self.name).join(format!("serve-{role}-{port}.log"));
        let pid = sys::spawn_detached(&self.netns, exe, &o.to_args(), &log)
            .with_context(|| format!("starting {} serve in {}", exe.display(), self.netns))?;
        self.st().servers.push(ServerInfo {
            role: role.into(),
            kind: "builtin-process".into(),
            port,
            pid: Some(pid),
            prefix: None,
            config: Some(exe.to_path_buf()),
            log: Some(log.clone()),
            fixed: false,
        });
        self.save()?;
        sys::wait_answer(
            SocketAddr::from((self.server_addr, port)),
            Duration::from_secs(10),
            Some(pid),
        )
        .with_context(|| {
            format!(
                "the built-in {role} server does not answer on port {port}; {}",
                sys::tail(&log, 5)
            )
        })?;
        Ok(pid)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, s) in self.inproc().iter_mut() {
            s.stop();
        }
        self.inproc().clear();
        if self.teardown_on_drop {
            let state = self.state();
            if let Err(e) = teardown(&self.name, Some(&state)) {
                log::warn!(target: "lagtrace lab", "tearing down {}: {e:#}", self.name);
            }
        }
    }
}

/// `Server::spawn`, again for up to 3 s while the port is still in use: a process that
/// forked in the meantime (any `Command` of this process) holds the old listener until its
/// exec.
fn spawn_retrying(o: serve::ServeOptions) -> std::io::Result<serve::Server> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match serve::Server::spawn(o.clone()) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn builtin_options(addr: Ipv4Addr, port: u16, nodelay: bool, netns: NetNs) -> serve::ServeOptions {
    serve::ServeOptions {
        listen: SocketAddr::from((addr, port)),
        nodelay,
        // The latency server writes headers and body separately (like nginx's header write
        // + sendfile); the fix only changes TCP_NODELAY.
        split_writes: port == LATENCY_PORT,
        netns,
        ..serve::ServeOptions::default()
    }
}

fn read_state(name: &str) -> Result<Option<LabState>> {
    let f = state_dir(name).join("state.json");
    match fs::read(&f) {
        Ok(b) => Ok(Some(
            serde_json::from_slice(&b).with_context(|| format!("reading {}", f.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", f.display())),
    }
}

/// One line of a server's configuration that [`Lab::fix`] or [`Lab::unfix`] set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEdit {
    /// The file.
    pub file: PathBuf,
    /// Its 1-based line number, after the edit.
    pub line: usize,
    /// The line as it was (trimmed); `None` when the directive was added.
    pub before: Option<String>,
    /// The line as it is now (trimmed).
    pub after: String,
}

impl ConfigEdit {
    /// `FILE:LINE: `before` → `after``, or what else happened, in one line.
    pub fn describe(&self) -> String {
        let at = format!("{}:{}", self.file.display(), self.line);
        match &self.before {
            Some(b) if *b == self.after => format!("{at}: already `{b}`"),
            Some(b) => format!("{at}: `{b}` → `{}`", self.after),
            None => format!("{at}: added `{}`", self.after),
        }
    }
}

/// `text` (an nginx config) with the first `name` directive set to `value`, indentation and
/// every other line kept; added after the `http {` line when there is none. The edit's
/// `file` is left empty.
pub fn set_directive(text: &str, name: &str, value: &str) -> (String, ConfigEdit) {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let is_it = |l: &str| {
        l.trim_start()
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(char::is_whitespace))
    };
    let after = format!("{name} {value};");
    let (line, before) = match lines.iter().position(|l| is_it(l)) {
        Some(i) => {
            let l = &lines[i];
            let indent = &l[..l.len() - l.trim_start().len()];
            let before = l.trim().to_string();
            lines[i] = format!("{indent}{after}");
            (i + 1, Some(before))
        }
        None => {
            let at = lines
                .iter()
                .position(|l| l.trim_start().starts_with("http") && l.contains('{'))
                .map_or(lines.len(), |i| i + 1);
            lines.insert(at, format!("    {after}"));
            (at + 1, None)
        }
    };
    let mut out = lines.join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    (
        out,
        ConfigEdit {
            file: PathBuf::new(),
            line,
            before,
            after,
        },
    )
}

/// The nginx config of one lab server. `latency` selects the latency server's settings;
/// `nodelay` its tcp_nodelay (the good server always has the stock `on`).
pub fn nginx_config(prefix: &Path, port: u16, latency: bool, nodelay: bool) -> String {
    let p = prefix.display();
    let (workers, tuning) = if latency {
        (
            "1",
            format!(
                "    sendfile on;\n    tcp_nopush off;\n    tcp_nodelay {};\n    keepalive_timeout 65;\n",
                if nodelay { "on" } else { "off" }
            ),
        )
    } else {
        ("auto", "    sendfile on;\n    tcp_nopush on;\n".to_string())
    };
    format!(
        "# written by lagtrace lab\nuser root;\nworker_processes {workers};\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
events {{\n    worker_connections 768;\n}}\n\
http {{\n{tuning}    types_hash_max_size 2048;\n    include /etc/nginx/mime.types;\n    default_type application/octet-stream;\n\
    access_log {p}/access.log;\n    client_body_temp_path {p}/client_body;\n    proxy_temp_path {p}/proxy;\n\
    fastcgi_temp_path {p}/fastcgi;\n    uwsgi_temp_path {p}/uwsgi;\n    scgi_temp_path {p}/scgi;\n\
    server {{\n        listen {port} default_server;\n        server_name _;\n        root {NGINX_ROOT};\n        index index.html;\n    }}\n}}\n"
    )
}

/// Name of the nftables `netdev` table of [`Lab::drop_percent`].
pub fn drop_table(name: &str) -> String {
    format!("lagtrace_lab_{:08x}", fnv1a(name) as u32)
}

fn teardown(name: &str, state: Option<&LabState>) -> Result<()> {
    sys::delete_nft_table(&drop_table(name));
    let ns = netns_name(name);
    let nsfile = NetNs::Named(ns.clone());
    // Processes the lab started (nginx masters, serve processes), then anything still in
    // the lab's own namespace: those are ours too.
    let mut pids: Vec<u32> = state
        .map(|s| s.servers.iter().filter_map(|x| x.pid).collect())
        .unwrap_or_default();
    // Only processes still in the lab's namespace: a pid from the state may have been
    // reused. The recorded inode also finds them when the namespace's name was removed.
    let ns_inode = nsfile
        .inode()
        .ok()
        .or(state.map(|s| s.netns_inode).filter(|&i| i != 0));
    pids.retain(|&p| ns_inode.is_some() && sys::pid_netns_inode(p) == ns_inode);
    if nsfile.exists() {
        pids.extend(sys::netns_pids(&ns));
    }
    pids.sort_unstable();
    pids.dedup();
    for &p in &pids {
        let _ = sys::signal(p, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while pids.iter().any(|&p| sys::alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if nsfile.exists() {
        for p in sys::netns_pids(&ns).into_iter().chain(pids.iter().copied()) {
            if sys::alive(p) {
                let _ = sys::signal(p, libc::SIGKILL);
            }
        }
        sys::ip(&["netns", "del", &ns]).with_context(|| format!("deleting namespace {ns}"))?;
    }
    if let Some(s) = state {
        if sys::link_exists(&s.client_iface) {
            let _ = sys::ip(&["link", "del", &s.client_iface]);
        }
    } else {
        let tag = format!("{:08x}", fnv1a(name) as u32);
        let c = format!("lt{tag}c");
        if sys::link_exists(&c) {
            let _ = sys::ip(&["link", "del", &c]);
        }
    }
    let dir = state_dir(name);
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("a-b_C9").is_ok());
        assert!(validate_name(&"x".repeat(24)).is_ok());
        for bad in ["", "a b", "a/b", "a.b", &"x".repeat(25)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        // Interface names stay within IFNAMSIZ - 1 = 15 characters.
        let tag = format!("{:08x}", fnv1a(&"x".repeat(24)) as u32);
        assert!(format!("lt{tag}c").len() <= 15);
    }

    /// The fix edits one line, in place, and undoes to the same text; a config without the
    /// directive gets it in its `http` block; a longer name is not the directive.
    #[test]
    fn set_directive_changes_exactly_one_line() {
        let conf = nginx_config(Path::new("/p"), 8080, true, false);
        let (on, e) = set_directive(&conf, "tcp_nodelay", "on");
        let diff: Vec<(&str, &str)> = conf
            .lines()
            .zip(on.lines())
            .filter(|(a, b)| a != b)
            .collect();
        assert_eq!(diff, [("    tcp_nodelay off;", "    tcp_nodelay on;")]);
        assert_eq!(conf.lines().count(), on.lines().count());
        assert_eq!(e.before.as_deref(), Some("tcp_nodelay off;"));
        assert_eq!(on.lines().nth(e.line - 1), Some("    tcp_nodelay on;"));
        assert_eq!(set_directive(&on, "tcp_nodelay", "off").0, conf);
        let (same, e) = set_directive(&on, "tcp_nodelay", "on");
        assert_eq!(same, on);
        assert!(
            e.describe().ends_with(": already `tcp_nodelay on;`"),
            "{}",
            e.describe()
        );

        let good = nginx_config(Path::new("/p"), 8081, false, true);
        let (added, e) = set_directive(&good, "tcp_nodelay", "on");
        assert_eq!(e.before, None);
        assert_eq!(added.lines().count(), good.lines().count() + 1);
        assert_eq!(added.lines().nth(e.line - 2), Some("http {"));
        let (x, e) = set_directive("http {\n    tcp_nodelayx on;\n}\n", "tcp_nodelay", "on");
        assert_eq!(x, "http {\n    tcp_nodelay on;\n    tcp_nodelayx on;\n}\n");
        assert_eq!((e.line, e.before), (2, None));
    }

    /// The generated configs are valid for the real nginx (`nginx -t`), and the latency
    /// server has exactly the case's settings.
    #[test]
    fn nginx_configs_pass_nginx_t() {
        if !Path::new(NGINX).exists() {
            eprintln!("nginx not installed: skipping nginx -t");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        for (latency, nodelay) in [(false, true), (true, false), (true, true)] {
            let conf = nginx_config(dir.path(), 8080, latency, nodelay);
            if latency {
                assert!(conf.contains("worker_processes 1;"));
                assert!(conf.contains("sendfile on;") && conf.contains("tcp_nopush off;"));
                let want = if nodelay {
                    "tcp_nodelay on;"
                } else {
                    "tcp_nodelay off;"
                };
                assert!(conf.contains(want), "{conf}");
            } else {
                assert!(
                    !conf.contains("tcp_nodelay"),
                    "good server keeps the stock default"
                );
            }
            let file = dir.path().join("t.conf");
            fs::write(&file, &conf).expect("write");
            let out = std::process::Command::new(NGINX)
                .arg("-t")
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&file)
                .arg("-e")
                .arg(dir.path().join("t.log"))
                .output()
                .expect("nginx -t");
            assert!(
                out.status.success(),
                "{}\n{conf}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
