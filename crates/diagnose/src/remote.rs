//! The server-side layers from another host: `lagtrace agent` (or any [`RemoteServer`]).
//!
//! When the server runs elsewhere, diagnose cannot enter its namespace. A [`RemoteServer`]
//! gives the same three layers over a window that covers the c=N run: the server's sockets
//! (layer 4), its host's kernel deltas (layer 5) and a server-side capture of this
//! client's connections (layer 3), which is analysed and joined here exactly as a local
//! capture is. This crate knows nothing of the transport (the agent crate implements it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lagtrace_model::diagnosis::evidence::HopEvidence;
use lagtrace_model::host::HostReport;

use crate::evidence::{Layer, PacketEvidence, SocketEvidence};
use crate::run::{self, Step, UnderLoad};

/// A source of the server-side layers on another host.
pub trait RemoteServer: Send + Sync + std::fmt::Debug {
    /// Where the layers come from, for the report (e.g. `agent 10.0.0.2:7700`).
    fn label(&self) -> String;
    /// Opens a window of `window` on the server's listener at `server` (the address the
    /// clients connect to, the port): its capture and its
    /// host layer start now, and the watch of its hops unless `hops` is false (`--no-hops`).
    /// `Err`: why the window could not be opened (one line).
    fn open(
        &self,
        server: std::net::SocketAddr,
        window: Duration,
        hops: bool,
    ) -> Result<Box<dyn RemoteWindow>, String>;
}

/// An open window of a [`RemoteServer`].
pub trait RemoteWindow: Send + Sync {
    /// Layer 4: the server's sockets and options now.
    fn sockets(&self) -> Layer<SocketEvidence>;
    /// Ends the window (waiting for its end when needed) and returns the host layer and
    /// the server-side capture.
    fn finish(&self) -> RemoteLayers;
}

/// What a window ends with.
#[derive(Debug)]
pub struct RemoteLayers {
    /// Layer 5 over the window.
    pub host: Layer<HostReport>,
    /// The server-side capture, or the packet layer saying why there is none.
    pub capture: Result<RemoteCapture, Layer<PacketEvidence>>,
    /// Said on every layer from the window (where from; the clock offset applied).
    pub note: String,
    /// The hops behind the server the agent followed over the window (its own
    /// connections to its upstreams, captured and analysed there).
    pub hops: Vec<HopEvidence>,
}

/// A server-side capture, its timestamps already on this host's clock.
#[derive(Debug)]
pub struct RemoteCapture {
    /// Classic pcap bytes.
    pub pcap: Vec<u8>,
    /// Where it was taken (interface and host).
    pub point: String,
    /// Packets the server's kernel dropped from the capture.
    pub dropped: u64,
}

/// Appends `note` to a layer's reason: the report says which evidence came from where.
fn from_remote<T>(mut l: Layer<T>, note: &str) -> Layer<T> {
    // A layer the agent could not give (lost mid-run, refused) keeps its own reason alone:
    // "applied" would claim a measurement that is not there.
    if l.data.is_none() {
        return l;
    }
    l.reason = Some(match l.reason.take() {
        Some(r) => format!("{r}; {note}"),
        None => note.to_string(),
    });
    l
}

/// The agent's host report with this lagtrace's CPU counted as the measurement's own when
/// the agent runs on this very host: the agent counts only itself as "this lagtrace", so the
/// load generator — another process there — was "other work" holding the server's CPUs, and
/// a healthy server waiting behind our own load read as `cpu-contention`. Recognised by
/// `pid` (this process) with a `lagtrace` command among the report's largest CPU users; it
/// may share the server's CPUs (its affinity is not in the report), which only makes the
/// rules excuse the tail as the measurement's own, never blame the server.
fn own_load_generator(mut l: Layer<HostReport>, pid: u32) -> Layer<HostReport> {
    let Some(c) = l.data.as_mut().and_then(|h| h.cpu.data.as_mut()) else {
        return l;
    };
    if let Some(i) = c
        .top
        .iter()
        .position(|p| p.pid == pid && p.comm.starts_with("lagtrace"))
    {
        let me = c.top.remove(i);
        c.others_us = c.others_us.saturating_sub(me.cpu_us);
        c.own_us += me.cpu_us;
        c.own_shares_cpus = true;
    }
    l
}

/// Steps 3-5 with the server side from `remote`: the c=N load with the SYN ping under load
/// here, and the server's capture, sockets and host over the window there.
pub(crate) fn under_load(
    remote: &dyn RemoteServer,
    lo: lagtrace_load::LoadOptions,
    concurrency: u32,
    sa: SocketAddr,
    hops: bool,
    stop: &Arc<AtomicBool>,
    progress: &dyn Fn(Step),
) -> UnderLoad {
    let cn_dur = lo.duration.unwrap_or_default();
    let label = remote.label();
    progress(Step::Start(format!(
        "server side from {label}: capture, sockets and host over {:.1} s",
        cn_dur.as_secs_f64()
    )));
    let window: Result<Arc<dyn RemoteWindow>, String> =
        remote.open(sa, cn_dur, hops).map(Arc::from);
    let (pinger, ping_stop) = run::start_pinger(sa);
    let insp: Arc<Mutex<Option<Layer<SocketEvidence>>>> = Arc::new(Mutex::new(None));
    let inspector = window.as_ref().ok().map(|w| {
        let (w, insp, stop) = (w.clone(), insp.clone(), stop.clone());
        std::thread::spawn(move || {
            let l = if run::nap(Duration::from_millis(1200), &stop) {
                Layer::skipped(run::INTERRUPTED)
            } else {
                w.sockets()
            };
            *insp.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
        })
    });
    progress(Step::Start(format!(
        "app: c={concurrency} concurrent keep-alive connections for {:.1} s",
        cn_dur.as_secs_f64()
    )));
    let cn = run::app_cn(&lo, concurrency, stop, progress);
    ping_stop.store(true, Ordering::Relaxed);
    let (ping, notes) = run::join_pinger(pinger);
    if let Some(h) = inspector {
        let _ = h.join();
    }
    let (packets, sockets, host, hops) = match window {
        Err(e) => {
            let why = format!("{label}: {e}");
            (
                Layer::unavailable(why.clone()),
                Layer::unavailable(why.clone()),
                Layer::unavailable(why),
                Vec::new(),
            )
        }
        Ok(w) => {
            let sockets = insp
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .unwrap_or_else(|| Layer::error("the inspection thread did not finish"));
            progress(Step::Start(format!("packets: the capture from {label}")));
            let r = w.finish();
            let packets = match r.capture {
                Ok(c) => run::analyse_pcap_bytes(&c.pcap, c.point, c.dropped, &cn),
                Err(l) => l,
            };
            (
                from_remote(packets, &r.note),
                from_remote(sockets, &r.note),
                from_remote(own_load_generator(r.host, std::process::id()), &r.note),
                r.hops,
            )
        }
    };
    for (ok, line) in [
        (packets.get().is_some(), run::packets_line(&packets)),
        (sockets.get().is_some(), run::sockets_line(&sockets)),
        (
            host.get().is_some(),
            format!("host: {}", host.status.name()),
        ),
    ] {
        progress(if ok {
            Step::Done(line)
        } else {
            Step::NotRun(line)
        });
    }
    UnderLoad {
        cn,
        ping,
        notes,
        packets,
        sockets,
        host,
        hops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(top: serde_json::Value) -> Layer<HostReport> {
        Layer::ran(
            serde_json::from_value(serde_json::json!({
                "scope": {"pid": 4242, "comm": "nginx", "netns_inode": 1},
                "window_us": 2_000_000,
                "counters": {"status": "ok", "data": []},
                "listeners": {"status": "ok", "data": []},
                "cgroup": {"status": "skipped", "reason": "x"},
                "threads": {"status": "skipped", "reason": "x"},
                "cpu": {"status": "ok", "data": {
                    "cpus": 2, "busy_us": 3_000_000, "busy_share": 0.75, "own_us": 100_000,
                    "watched_us": 1_000_000, "others_us": 1_900_000, "unattributed_us": 0,
                    "own_shares_cpus": false, "top": top}},
                "qdiscs": {"status": "ok", "data": []},
                "sockstat": {"status": "skipped", "reason": "x"},
                "drops": {"status": "skipped", "reason": "x"},
                "cost": {"cpu_us": 0, "cpu_share": 0.0}
            }))
            .expect("host report"),
        )
    }

    #[test]
    fn the_load_generator_on_the_agents_host_is_the_measurements_own() {
        let top = serde_json::json!([
            {"pid": 77, "comm": "lagtrace", "cpu_us": 1_250_000},
            {"pid": 90, "comm": "rustc", "cpu_us": 600_000}]);
        let l = own_load_generator(report(top.clone()), 77);
        let c = l.get().unwrap().cpu.get().unwrap();
        assert_eq!(c.own_us, 1_350_000);
        assert_eq!(c.others_us, 650_000);
        assert!(c.own_shares_cpus);
        assert_eq!(c.top.len(), 1);
        // Another pid (a load generator elsewhere), or our pid under another command: left.
        for (pid, comm) in [(78, "lagtrace"), (90, "rustc")] {
            let l = own_load_generator(report(top.clone()), pid);
            let c = l.get().unwrap().cpu.get().unwrap();
            assert_eq!(
                (c.own_us, c.others_us),
                (100_000, 1_900_000),
                "{pid} {comm}"
            );
        }
    }
}
