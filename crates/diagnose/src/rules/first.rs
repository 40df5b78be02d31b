//! The first request on each connection against the later ones. A server slow to start
//! serving a new connection — an accept loop that falls behind, per-connection setup (a TLS
//! handshake, authentication, a backend connection opened per client) — costs every client
//! that opens connections often, on each of them, though keep-alive hides it from a load
//! run's p99 (one first request per connection, thousands of later ones). The connect is
//! not in these latencies (they start at the request's first write), so the wait is the
//! server's, after the kernel accepted the connection.

use lagtrace_model::diagnosis::evidence::{AppRun, LayerName};

use super::{EvidenceLine, SLOW_SERVER_US, ms, note};

/// First requests needed in the c=N run (one slow first request is one sample).
const MIN_REQUESTS: u64 = 5;
/// How many times the later requests' median the first requests' median must be.
const RATIO: u64 = 5;

/// Whether a run's first requests on a connection waited materially longer than its later
/// ones: a median at least [`RATIO`] times theirs and [`SLOW_SERVER_US`] more, with at
/// least `min` first requests. `(first p50, later p50, first requests)`.
fn elevated(run: &AppRun, min: u64) -> Option<(u64, u64, u64)> {
    let (f, l) = (run.first_request.as_ref()?, run.later_requests.as_ref()?);
    (f.count >= min.max(1)
        && l.count >= 1
        && f.p50_us >= RATIO * l.p50_us
        && f.p50_us >= l.p50_us + SLOW_SERVER_US)
        .then_some((f.p50_us, l.p50_us, f.count))
}

/// The c=N run's `(first p50, later p50, first requests)` when new connections wait in both
/// runs: c=1's one connection and c=N's (at least [`MIN_REQUESTS`]). Either alone is not
/// enough: c=1's first request is one sample (a cold cache, a thread created), and c=N's
/// connections all start at once, so their first requests queue behind each other's
/// connects (seen: 16 ms against 72 µs, the server quick to serve a connection).
pub(super) fn slow_first(c1: Option<&AppRun>, cn: Option<&AppRun>) -> Option<(u64, u64, u64)> {
    elevated(c1?, 1)?;
    elevated(cn?, MIN_REQUESTS)
}

/// The note when new connections wait ([`slow_first`]).
pub(super) fn note_line(c1: Option<&AppRun>, cn: Option<&AppRun>) -> Option<EvidenceLine> {
    let (first, later, n) = slow_first(c1, cn)?;
    let one = c1?.first_request.as_ref()?.p50_us;
    Some(note(
        LayerName::App,
        format!(
            "the first request on each connection waited p50 {} at {} ({n} connections; \
             {} at c=1) against {} for the later ones: the server is slow to start serving \
             a new connection (an accept loop that falls behind, per-connection setup such \
             as a TLS handshake or a backend connection); keep-alive hides it from these \
             runs' p99, but clients that open connections often pay it on every request",
            ms(first),
            cn?.label(),
            ms(one),
            ms(later)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lagtrace_model::diagnosis::evidence::Percentiles;

    fn pct(count: u64, p50_us: u64) -> Option<Percentiles> {
        Some(Percentiles {
            count,
            p50_us,
            p90_us: p50_us,
            p99_us: p50_us,
            max_us: p50_us,
            ..Percentiles::default()
        })
    }

    fn run(first: Option<Percentiles>, later: Option<Percentiles>) -> AppRun {
        AppRun {
            concurrency: 32,
            first_request: first,
            later_requests: later,
            ..AppRun::default()
        }
    }

    #[test]
    fn a_server_slow_to_start_a_connection_is_named() {
        let c1 = run(pct(1, 120_000), pct(40, 3_000));
        let cn = run(pct(32, 150_000), pct(9_000, 3_700));
        assert_eq!(slow_first(Some(&c1), Some(&cn)), Some((150_000, 3_700, 32)));
        let line = note_line(Some(&c1), Some(&cn)).unwrap();
        assert!(
            line.text
                .contains("waited p50 150.00ms at c=32 (32 connections; 120.00ms at c=1)"),
            "{}",
            line.text
        );
        // Not: c=N's connection storm alone (c=1's first request quick), c=1's one slow
        // first request alone, a few ms more, a ratio under 5 (a slow server is slow on
        // every request), too few connections, or no later requests to compare with.
        let quick1 = run(pct(1, 200), pct(140, 34));
        for (c1, cn) in [
            (&quick1, run(pct(32, 15_831), pct(13_672, 72))),
            (&c1, run(pct(32, 4_000), pct(9_000, 3_000))),
            (&c1, run(pct(32, 12_000), pct(9_000, 4_000))),
            (&c1, run(pct(32, 200_000), pct(9_000, 50_000))),
            (&c1, run(pct(3, 150_000), pct(9_000, 3_700))),
            (&c1, run(pct(32, 150_000), None)),
        ] {
            assert_eq!(
                slow_first(Some(c1), Some(&cn)),
                None,
                "{:?}",
                cn.first_request
            );
            assert!(note_line(Some(c1), Some(&cn)).is_none());
        }
        assert_eq!(slow_first(None, Some(&cn)), None, "passive: no c=1");
    }
}
