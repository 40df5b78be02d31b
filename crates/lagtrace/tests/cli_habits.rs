//! The command line for people arriving from the peers: every subcommand's --help ends with
//! examples, shell completions and manual pages are generated and valid, the peers' flags
//! that mean the same are accepted (checked on real probes), and the others are refused with
//! one line saying what to use — before any traffic.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_lagtrace");

fn lagtrace(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run lagtrace")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The names listed under "Commands:" of a --help text (without `help`).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| n != "help")
        .collect()
}

#[test]
fn every_subcommands_help_ends_with_two_or_three_examples() {
    let top = stdout(&lagtrace(&["--help"]));
    let mut paths: Vec<Vec<String>> = Vec::new();
    for c in commands(&top) {
        let help = stdout(&lagtrace(&[&c, "--help"]));
        for sub in commands(&help) {
            paths.push(vec![c.clone(), sub]);
        }
        paths.push(vec![c]);
    }
    assert!(paths.len() >= 13, "{paths:?}");
    for p in &paths {
        let mut args: Vec<&str> = p.iter().map(String::as_str).collect();
        args.push("--help");
        let o = lagtrace(&args);
        assert!(o.status.success(), "{args:?}");
        let help = stdout(&o);
        let at = help
            .rfind("Examples:")
            .unwrap_or_else(|| panic!("{args:?}: no Examples:\n{help}"));
        let examples: Vec<&str> = help[at..].lines().skip(1).collect();
        let n = examples.len();
        assert!((2..=3).contains(&n), "{args:?}: {n} example lines:\n{help}");
        for e in examples {
            let cmd = e.trim_start().trim_start_matches("(fix the server)").trim();
            assert!(
                e.starts_with("  ") && cmd.starts_with(&format!("lagtrace {}", p[0])),
                "{args:?}: {e:?} is not an example of this command"
            );
        }
    }
}

#[test]
fn completions_are_valid_scripts_that_know_every_subcommand() {
    let top = stdout(&lagtrace(&["--help"]));
    let names = commands(&top);
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = lagtrace(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for n in &names {
            assert!(script.contains(n.as_str()), "{shell} completion lacks {n}");
        }
        let file = dir.path().join(format!("lagtrace.{shell}"));
        std::fs::write(&file, &script).unwrap();
        // Syntax check with the shell itself where it is installed (bash always is).
        let check = match shell {
            "bash" => Some(("bash", "-n")),
            "zsh" => Some(("zsh", "-n")),
            "fish" => Some(("fish", "--no-execute")),
            _ => None,
        };
        if let Some((sh, flag)) = check
            && let Ok(c) = Command::new(sh).arg(flag).arg(&file).output()
        {
            assert!(c.status.success(), "{sh} {flag}: {}", stderr(&c));
        } else {
            assert!(shell != "bash", "bash must check the bash completion");
        }
    }
    // The bash completion completes: sourced, it offers the subcommands after `lagtrace `.
    let probe = format!(
        "source {}; COMP_WORDS=(lagtrace di); COMP_CWORD=1; COMP_LINE='lagtrace di'; \
         COMP_POINT=11; _lagtrace lagtrace di lagtrace; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        dir.path().join("lagtrace.bash").display()
    );
    let c = Command::new("bash").args(["-c", &probe]).output().unwrap();
    assert_eq!(stdout(&c).trim(), "diagnose", "{}", stderr(&c));
    assert!(!lagtrace(&["completions", "tcsh"]).status.success());
}

/// groff renders the page with no warning (-ww), and `man -l` shows it.
fn check_man_page(page: &Path, must: &[&str]) {
    let g = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(page)
        .output()
        .expect("groff (apt-get install groff-base; .ci/setup does)");
    assert!(
        g.status.success() && g.stderr.is_empty(),
        "{page:?}: {}",
        stderr(&g)
    );
    let m = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .expect("man (apt-get install man-db; .ci/setup does)");
    assert!(m.status.success(), "man -l {page:?}: {}", stderr(&m));
    let text = stdout(&m);
    for s in must {
        assert!(text.contains(s), "{page:?} lacks {s:?}:\n{text}");
    }
    // A paragraph of the help is one in the page: "Exit status:" and "Examples:" start a line
    // (a help text without the blank line before them ran them into the sentence before).
    for l in text.lines() {
        for head in ["Exit status:", "Examples:"] {
            if let Some(at) = l.find(head) {
                assert!(l[..at].trim().is_empty(), "{page:?}: {head} runs on: {l:?}");
            }
        }
    }
    assert!(
        !text.contains("-help("),
        "{page:?} lists a help page:\n{text}"
    );
}

#[test]
fn man_pages_render_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("lagtrace.1");
    let o = lagtrace(&["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&top, &o.stdout).unwrap();
    check_man_page(&top, &["NAME", "SYNOPSIS", "diagnose", "completions"]);
    let ping = dir.path().join("lagtrace-ping.1");
    let o = lagtrace(&["man", "ping"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&ping, &o.stdout).unwrap();
    check_man_page(&ping, &["lagtrace-ping", "--syn", "Examples:"]);
    // All pages at once, as a package would install them.
    let all = dir.path().join("man1");
    std::fs::create_dir(&all).unwrap();
    let o = lagtrace(&["man", "--dir", all.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for name in ["lagtrace.1", "lagtrace-diagnose.1", "lagtrace-lab-up.1"] {
        check_man_page(&all.join(name), &["NAME"]);
    }
    // One page per command a reader can run: none for clap's `help` subcommands.
    let mut names: Vec<String> = std::fs::read_dir(&all)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.iter().all(|n| !n.contains("help")), "{names:?}");
    assert!(
        names.contains(&"lagtrace-load-merge.1".to_string()),
        "{names:?}"
    );
    for name in &names {
        check_man_page(&all.join(name), &["NAME"]);
    }
    // A nested page by its words, as `man` would be asked.
    let merge = dir.path().join("merge.1");
    let o = lagtrace(&["man", "load", "merge"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&merge, &o.stdout).unwrap();
    check_man_page(&merge, &["lagtrace-load-merge", "--timeline"]);
    let o = lagtrace(&["man", "nosuch"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("one of: ping, route"), "{}", stderr(&o));
    let o = lagtrace(&["man", "load", "nosuch"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("of lagtrace load (one of: merge)"),
        "{}",
        stderr(&o)
    );
}

/// `--netns` completes network namespace names in bash, not file names.
#[test]
#[ignore = "needs root"]
fn bash_completes_netns_with_the_namespaces() {
    let mut guard = lagtrace_testkit::net::NetGuard::new();
    let ns = guard.add_ns("comp");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lagtrace.bash");
    std::fs::write(&file, lagtrace(&["completions", "bash"]).stdout).unwrap();
    for cmd in ["capture", "sockets", "host", "serve"] {
        let probe = format!(
            "source {}; COMP_WORDS=(lagtrace {cmd} --netns ''); COMP_CWORD=3; \
             COMP_LINE='lagtrace {cmd} --netns '; _lagtrace lagtrace '' --netns; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display()
        );
        let c = Command::new("bash").args(["-c", &probe]).output().unwrap();
        let offered: Vec<&str> = std::str::from_utf8(&c.stdout).unwrap().lines().collect();
        assert!(
            offered.contains(&ns.as_str()),
            "{cmd}: {offered:?} {}",
            stderr(&c)
        );
        assert!(
            offered.iter().all(|o| !o.contains('/')),
            "{cmd}: files {offered:?}"
        );
    }
}

/// Runs `args` against a listener that nobody else uses and asserts a one-line refusal
/// (exit 2) naming `says`, with no connection made.
fn refused(args: &[&str], says: &[&str]) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("PORT", &port.to_string()))
        .collect();
    let o = Command::new(BIN).args(&args).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(stdout(&o).is_empty(), "{args:?} printed {}", stdout(&o));
    let first = err.lines().next().unwrap_or("");
    for s in says {
        assert!(
            first.contains(s),
            "{args:?}: {s:?} not in the first line {first:?}"
        );
    }
    assert!(l.accept().is_err(), "{args:?} connected to the target");
}

#[test]
fn peer_flags_with_no_equivalent_are_refused_before_any_traffic() {
    refused(
        &[
            "load",
            "-t1",
            "-c2",
            "-d1s",
            "-s",
            "post.lua",
            "http://127.0.0.1:PORT/",
        ],
        &["Lua scripts (wrk -s) are not supported", "-H/--header"],
    );
    refused(
        &["capture", "-n", "-r", "case.pcap"],
        &["lagtrace analyze FILE"],
    );
    refused(
        &["ping", "--flood", "-p", "PORT", "127.0.0.1"],
        &["no flood mode", "-i"],
    );
    // From the table (docs/peer-flags.md), through the binary: one line, exit 2, no probe.
    refused(
        &["route", "-A", "-p", "PORT", "127.0.0.1"],
        &["route -A (traceroute's AS path lookups)", "no AS lookups"],
    );
    refused(
        &["route", "--curses", "-p", "PORT", "127.0.0.1"],
        &["--report N prints the table"],
    );
    refused(
        &["load", "-R", "10", "-D", "exp", "http://127.0.0.1:PORT/"],
        &[
            "load -D (wrk2's arrival distribution)",
            "constant rate (-R)",
        ],
    );
    refused(&["capture", "-i", "lo", "-D"], &["`ip -br link`"]);
    refused(
        &["capture", "-i", "lo", "-vv"],
        &["lagtrace analyze -v FILE"],
    );
    refused(
        &["analyze", "-Y", "tcp.port==80", "x.pcap"],
        &["--stream N"],
    );
    refused(&["analyze", "-z", "conv,tcp", "-q", "x.pcap"], &["--json"]);
    // A stray word before the URL: the stray word is named, not the URL.
    refused(
        &[
            "load",
            "-t1",
            "-c2",
            "-d1s",
            "oops",
            "http://127.0.0.1:PORT/",
        ],
        &["load takes one URL", "'oops'"],
    );
}

/// Mapped and ignored peer flags do what the table says, on real runs: `ping -n -t 64 -V`
/// probes as `ping --ttl 64` (one note per flag on stderr), `analyze -q -2 -r FILE` prints
/// what `analyze FILE` prints.
#[test]
fn mapped_peer_flags_run_as_their_equivalent() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let peer = lagtrace(&[
        "ping",
        "--connect",
        "-n",
        "-t",
        "64",
        "-V",
        "-c",
        "2",
        "-i",
        "10ms",
        "-p",
        &port,
        "--json",
        "127.0.0.1",
    ]);
    let err = stderr(&peer);
    assert_eq!(peer.status.code(), Some(0), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("note:")).collect();
    assert_eq!(notes.len(), 3, "{err}");
    assert!(
        notes[1].contains("-t (hping3's TTL of the probes) is --ttl"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&peer.stdout).expect("json");
    assert_eq!(j["stats"]["received"], 2, "{j}");
    let pcap = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/case/nagle-delayed-ack.pcap"
    );
    let plain = lagtrace(&["analyze", pcap]);
    let peer = lagtrace(&["analyze", "-q", "-2", "-r", pcap]);
    assert_eq!(peer.status.code(), plain.status.code());
    assert_eq!(stdout(&peer), stdout(&plain));
    assert_eq!(stderr(&peer).lines().count(), 2, "{}", stderr(&peer));
}

#[test]
fn tcpdump_style_read_of_a_file_is_the_same_analysis() {
    let pcap = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/case/nagle-delayed-ack.pcap"
    );
    let plain = lagtrace(&["analyze", pcap]);
    let peer = lagtrace(&["analyze", "-n", "-r", pcap]);
    let nn = lagtrace(&["analyze", "-nn", "-r", pcap]);
    assert_eq!(plain.status.code(), Some(1), "{}", stderr(&plain));
    assert_eq!(peer.status.code(), plain.status.code());
    assert_eq!(stdout(&peer), stdout(&plain));
    assert_eq!(stdout(&nn), stdout(&plain));
}

#[test]
#[ignore = "needs root"]
fn hping3_flags_probe_with_syns_at_the_microsecond_interval() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let o = lagtrace(&[
        "ping",
        "-S",
        "-p",
        &port,
        "-i",
        "u10000",
        "-c",
        "20",
        "127.0.0.1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "tcp-syn", "{r:#}");
    let s = r["samples"].as_array().unwrap();
    assert_eq!(s.len(), 20);
    assert!(s.iter().all(|x| x["rtt_us"].is_number()), "{r:#}");
    // u10000 is hping3's 10 000 µs: 19 gaps of 10 ms (not 10 000 s, not the 1 s default).
    let span_ms = s[19]["sent_at_us"].as_f64().unwrap() / 1e3;
    assert!(
        (180.0..600.0).contains(&span_ms),
        "20 probes over {span_ms} ms"
    );
    // hping3 -1 is ICMP mode.
    let o = lagtrace(&[
        "ping",
        "-1",
        "-c",
        "2",
        "-i",
        "u10000",
        "127.0.0.1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "icmp", "{r:#}");
}

#[test]
#[ignore = "needs root"]
fn traceroute_and_mtr_flags_trace_and_report() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    // traceroute -T -w 2: TCP SYN probes, 2 s wait.
    let o = lagtrace(&[
        "route",
        "-T",
        "-w",
        "2",
        "-n",
        "-p",
        &port,
        "127.0.0.1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["mode"], "tcp-syn", "{r:#}");
    assert_eq!(r["reached"], true);
    // mtr -r -c 3: report mode, 3 rounds; -r alone: mtr's 10.
    for (args, rounds) in [
        (vec!["-r", "-c", "3"], 3),
        (vec!["-r"], 10),
        (vec!["-c", "2"], 2),
    ] {
        let mut a = vec!["route", "--interval", "10ms", "-p", &port];
        a.extend(args.iter().copied());
        a.extend(["127.0.0.1", "--json"]);
        let o = lagtrace(&a);
        assert_eq!(o.status.code(), Some(0), "{a:?}: {}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["rounds"], rounds, "{a:?}");
    }
}

/// README's "coming from" table: each lagtrace command in it parses (checked up to clap's
/// --help, which comes after every flag, so a flag it does not know fails), and each
/// "refused" row is refused.
#[test]
fn the_readme_table_of_peer_flags_is_true() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("### Coming from hping3"))
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with("| `"))
        .collect();
    assert!(table.len() >= 8, "{table:?}");
    for row in table {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (peer, ours) = (cells[1].trim_matches('`'), cells[2]);
        let host = |w: &str| match w {
            "HOST" => "127.0.0.1".to_string(),
            "URL" => "http://127.0.0.1:9/".to_string(),
            w => w.to_string(),
        };
        if ours == "refused" {
            let mut args: Vec<String> = peer.split_whitespace().skip(1).map(host).collect();
            let cmd = match peer.split_whitespace().next().unwrap() {
                "hping3" => "ping",
                "wrk" => "load",
                other => panic!("no lagtrace command for {other}"),
            };
            args.insert(0, cmd.into());
            let o = Command::new(BIN).args(&args).output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{args:?} is not refused");
            continue;
        }
        let mut args: Vec<String> = ours
            .trim_matches('`')
            .split_whitespace()
            .skip(1)
            .map(host)
            .collect();
        // A trailing capture filter takes every word after it: --help goes before it.
        let at = args.iter().position(|a| a == "tcp").unwrap_or(args.len());
        args.insert(at, "--help".into());
        let o = Command::new(BIN).args(&args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
}

/// The examples only name namespaces the lab makes (`lagtrace lab up` → `lt-default`), so a
/// reader can run them after the README's first steps (they named `lab1` and `lab-srv`).
#[test]
fn help_examples_name_only_the_labs_namespace() {
    let top = stdout(&lagtrace(&["--help"]));
    for c in commands(&top) {
        let help = stdout(&lagtrace(&[&c, "--help"]));
        let words: Vec<&str> = help.split_whitespace().collect();
        for w in words.windows(2).filter(|w| w[0] == "--netns") {
            let ns = w[1].trim_end_matches(['`', ')', ',', '.']);
            if ns.chars().all(|c| c.is_ascii_uppercase()) || ns.starts_with('<') {
                continue; // a placeholder: NS, NAME, <NAME>
            }
            assert_eq!(ns, "lt-default", "{c} --help names --netns {ns}");
        }
    }
}
