//! The reference case on one machine: a "server host" network namespace joined to the
//! current namespace by a veth pair, with real nginx (good on :80, latency on :8080) or the
//! built-in fault server inside it.
//!
//! API CONTRACT (other crates' tests code against this; keep it stable):
//! ```ignore
//! let lab = Lab::up(&LabOptions::new("mytest-1234"))?;   // guard: Drop tears it down
//! lab.good_url()     // "http://10.x.y.2:80/"
//! lab.latency_url()  // "http://10.x.y.2:8080/"
//! lab.server_addr()  // Ipv4Addr inside the namespace
//! lab.client_addr()  // Ipv4Addr on this namespace's veth end
//! lab.netns()        // NetNs::Named(..) of the server host
//! lab.client_iface() // veth name in the current namespace (capture here)
//! lab.fix()? / lab.unfix()?   // latency server: tcp_nodelay on / off, reloaded
//! Lab::down("name")?          // idempotent teardown by name (CLI `lab down`)
//! serve::Server::spawn(serve::ServeOptions{..})  // in-process fault server (tests)
//! ```
//! Not built yet: see issue #2.
