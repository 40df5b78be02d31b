//! tcpdump as a test's reference capture: started once it says it is listening, stopped with
//! SIGINT so the file is complete.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Starts `tcpdump {opts} -w file "tcp port {port}"` (inside `netns` if given) and waits
/// until it says it is listening.
pub fn spawn_tcpdump(netns: Option<&str>, opts: &[&str], file: &Path, port: u16) -> Child {
    spawn_tcpdump_filter(netns, opts, file, &format!("tcp port {port}"))
}

/// [`spawn_tcpdump`] with the capture filter `filter` (e.g. `tcp`: every connection).
pub fn spawn_tcpdump_filter(
    netns: Option<&str>,
    opts: &[&str],
    file: &Path,
    filter: &str,
) -> Child {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tcpdump"]);
            c
        }
        None => Command::new("tcpdump"),
    };
    let mut td = cmd
        .args(opts)
        .arg("-w")
        .arg(file)
        .arg(filter)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("run tcpdump");
    // On `any` it first names the link type (`data link type LINUX_SLL2`), then listens.
    let mut err = BufReader::new(td.stderr.take().expect("tcpdump's stderr"));
    let mut said = String::new();
    for _ in 0..3 {
        let mut line = String::new();
        err.read_line(&mut line).expect("reading tcpdump's stderr");
        said.push_str(&line);
        if line.contains("listening") {
            return td;
        }
    }
    let _ = td.kill();
    let _ = td.wait();
    panic!("tcpdump: {said}")
}

/// [`spawn_tcpdump`] on `dev`, unbuffered, 256-byte snaplen, a 32 MiB kernel buffer: with
/// the default 2 MiB, a capture on `any` of a multi-gigabit veth on a loaded machine lost
/// bursts of a megabyte or more (seen as sequence holes), so two captures of one run differed.
pub fn tcpdump_on(netns: Option<&str>, dev: &str, file: &Path, port: u16) -> Child {
    tcpdump_on_filter(netns, dev, file, &format!("tcp port {port}"))
}

/// [`tcpdump_on`] with the capture filter `filter`.
pub fn tcpdump_on_filter(netns: Option<&str>, dev: &str, file: &Path, filter: &str) -> Child {
    spawn_tcpdump_filter(
        netns,
        &[
            "-i",
            dev,
            "-nn",
            "-U",
            "--immediate-mode",
            "-s",
            "256",
            "-B",
            "32768",
        ],
        file,
        filter,
    )
}

/// Stops a tcpdump with SIGINT (so it flushes the file) and waits for it.
pub fn stop_tcpdump(mut td: Child) {
    // SAFETY: signalling a child this test started and has not reaped yet.
    unsafe { libc::kill(td.id() as i32, libc::SIGINT) };
    let _ = td.wait();
}
