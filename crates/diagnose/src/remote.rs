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

use lagtrace_model::host::HostReport;

use crate::evidence::{Layer, PacketEvidence, SocketEvidence};
use crate::run::{self, Step, UnderLoad};

/// A source of the server-side layers on another host.
pub trait RemoteServer: Send + Sync + std::fmt::Debug {
    /// Where the layers come from, for the report (e.g. `agent 10.0.0.2:7700`).
    fn label(&self) -> String;
    /// Opens a window of `window` on the server's listener on `port`: its capture and its
    /// host layer start now. `Err`: why the window could not be opened (one line).
    fn open(&self, port: u16, window: Duration) -> Result<Box<dyn RemoteWindow>, String>;
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
    l.reason = Some(match l.reason.take() {
        Some(r) => format!("{r}; {note}"),
        None => note.to_string(),
    });
    l
}

/// Steps 3-5 with the server side from `remote`: the c=N load with the SYN ping under load
/// here, and the server's capture, sockets and host over the window there.
pub(crate) fn under_load(
    remote: &dyn RemoteServer,
    lo: lagtrace_load::LoadOptions,
    concurrency: u32,
    sa: SocketAddr,
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
        remote.open(sa.port(), cn_dur).map(Arc::from);
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
    let (packets, sockets, host) = match window {
        Err(e) => {
            let why = format!("{label}: {e}");
            (
                Layer::unavailable(why.clone()),
                Layer::unavailable(why.clone()),
                Layer::unavailable(why),
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
                from_remote(r.host, &r.note),
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
        hops: Vec::new(),
    }
}
