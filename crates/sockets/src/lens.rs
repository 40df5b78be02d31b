//! Server configuration lenses: when a socket's owner is a known server, find its
//! configuration and report the directives that shape its sockets, with file:line.
//!
//! A lens implements [`ConfigLens`]; nginx is the first. HAProxy (`option http-server-close`,
//! `tune.*`), Envoy (`tcp_nodelay` is always on, socket_options) or Redis (`tcp-keepalive`)
//! can be added the same way and registered in [`lenses`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::procfs;

/// One directive's effective value in one scope of a server's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConfigFinding {
    /// Server software ("nginx").
    pub software: String,
    /// The main process the configuration belongs to.
    pub pid: u32,
    /// Scope: "http", or "server :8080" (with its listen ports), or "location / in server :8080".
    pub server: String,
    /// Ports the scope listens on (empty for the http scope).
    pub ports: Vec<u16>,
    /// Directive name (`tcp_nodelay`).
    pub directive: String,
    /// Effective value (`off`).
    pub value: String,
    /// File that sets it; `None` when it is the built-in default.
    pub file: Option<PathBuf>,
    /// 1-based line in `file`.
    pub line: Option<u32>,
    /// Whether the value is the server's default (no directive in the configuration).
    pub default: bool,
}

/// What a lens found for one server process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LensReport {
    /// Findings, one per directive and scope.
    pub findings: Vec<ConfigFinding>,
    /// What could not be read and why.
    pub notes: Vec<String>,
}

/// A lens onto one kind of server's configuration.
pub trait ConfigLens {
    /// Software name, e.g. "nginx".
    fn software(&self) -> &'static str;
    /// Whether this process (by pid and command name) is one this lens understands.
    fn matches(&self, pid: u32, comm: &str) -> bool;
    /// The process whose command line names the configuration (nginx: the master, the
    /// workers' parent). Processes that share a main pid are examined once.
    fn main_pid(&self, pid: u32) -> u32 {
        pid
    }
    /// Reads and interprets the configuration of the server whose main process is `pid`.
    fn inspect(&self, pid: u32) -> LensReport;
}

/// Every lens lagtrace knows.
pub fn lenses() -> Vec<Box<dyn ConfigLens>> {
    vec![Box::new(NginxLens)]
}

/// nginx: `tcp_nodelay`, `tcp_nopush`, `sendfile`, `keepalive_timeout`, `keepalive_requests`.
pub struct NginxLens;

/// nginx's compiled-in defaults (Debian build) for the directives we report.
const NGINX_DIRECTIVES: [(&str, &str); 5] = [
    ("tcp_nodelay", "on"),
    ("tcp_nopush", "off"),
    ("sendfile", "off"),
    ("keepalive_timeout", "75s"),
    ("keepalive_requests", "1000"),
];
const NGINX_DEFAULT_CONF: &str = "/etc/nginx/nginx.conf";
const NGINX_DEFAULT_PREFIX: &str = "/usr/share/nginx";

impl ConfigLens for NginxLens {
    fn software(&self) -> &'static str {
        "nginx"
    }

    fn matches(&self, _pid: u32, comm: &str) -> bool {
        comm == "nginx"
    }

    fn main_pid(&self, pid: u32) -> u32 {
        // Workers are children of the master; the master's own parent is not nginx.
        match procfs::ppid(pid) {
            Some(pp) if procfs::comm(pp).as_deref() == Some("nginx") => pp,
            _ => pid,
        }
    }

    fn inspect(&self, pid: u32) -> LensReport {
        let mut report = LensReport::default();
        let Some(args) = procfs::cmdline(pid) else {
            report.notes.push(format!(
                "nginx pid {pid}: command line unreadable (exited?)"
            ));
            return report;
        };
        let (conf, prefix) = nginx_conf_from_args(&args);
        let conf = match conf {
            Some(c) => c,
            None => PathBuf::from(NGINX_DEFAULT_CONF),
        };
        let conf = if conf.is_relative() {
            prefix
                .clone()
                .unwrap_or_else(|| PathBuf::from(NGINX_DEFAULT_PREFIX))
                .join(conf)
        } else {
            conf
        };
        // nginx opens its files in its own mount namespace; reach them through its root.
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let reader = FsReader { root: Some(root) };
        match parse_nginx(&conf, &reader) {
            Ok((tree, mut notes)) => {
                report.notes.append(&mut notes);
                report.findings = nginx_effective(&tree, pid);
                // nginx reads its files at start (and on reload): a file changed since is
                // what is on disk, maybe not what runs.
                let mut files: Vec<PathBuf> = report
                    .findings
                    .iter()
                    .filter_map(|f| f.file.clone())
                    .collect();
                files.push(conf.clone());
                files.sort();
                files.dedup();
                // Workers are forked after each (re)load: the newest one dates the config in
                // force (the master's own start time, without workers).
                let loaded = procfs::pids()
                    .into_iter()
                    .filter(|&p| procfs::ppid(p) == Some(pid))
                    .filter_map(procfs::start_time)
                    .chain(procfs::start_time(pid))
                    .max();
                if let Some(started) = loaded {
                    for f in files {
                        let modified = std::fs::metadata(reader.real(&f))
                            .and_then(|m| m.modified())
                            .ok();
                        // One second of slack: starttime has clock-tick resolution.
                        if modified.is_some_and(|m| m > started + Duration::from_secs(1)) {
                            report.notes.push(format!(
                                "nginx pid {pid}: {} changed after nginx last loaded its \
                                 configuration: the values shown are the file's and may not be \
                                 in effect until `nginx -s reload`",
                                f.display()
                            ));
                        }
                    }
                }
            }
            Err(e) => report
                .notes
                .push(format!("nginx pid {pid}: {}: {e}", conf.display())),
        }
        report
    }
}

/// `-c FILE` and `-p PREFIX` from an nginx command line. nginx rewrites its argv into one
/// string ("nginx: master process /usr/sbin/nginx -c /x.conf"), so split on spaces too.
pub fn nginx_conf_from_args(args: &[String]) -> (Option<PathBuf>, Option<PathBuf>) {
    let words: Vec<&str> = args.iter().flat_map(|a| a.split_whitespace()).collect();
    let mut conf = None;
    let mut prefix = None;
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let next = words.get(i + 1).map(|s| PathBuf::from(*s));
        match w {
            "-c" => {
                conf = next;
                i += 1;
            }
            "-p" => {
                prefix = next;
                i += 1;
            }
            _ if w.starts_with("-c") && w.len() > 2 => conf = Some(PathBuf::from(&w[2..])),
            _ if w.starts_with("-p") && w.len() > 2 => prefix = Some(PathBuf::from(&w[2..])),
            _ => {}
        }
        i += 1;
    }
    (conf, prefix)
}

/// Reads files, optionally through another root (a process's `/proc/PID/root`).
pub struct FsReader {
    /// Root to resolve absolute paths under; `None` = our own root.
    pub root: Option<PathBuf>,
}

impl FsReader {
    fn real(&self, p: &Path) -> PathBuf {
        match &self.root {
            Some(r) => r.join(p.strip_prefix("/").unwrap_or(p)),
            None => p.to_path_buf(),
        }
    }
    fn read(&self, p: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(self.real(p))
    }
    /// Expands a glob whose wildcards (`*`, `?`) are in the last component, sorted
    /// like nginx does (glob(3) order).
    fn glob(&self, pattern: &Path) -> Vec<PathBuf> {
        let s = pattern.to_string_lossy();
        if !s.contains(['*', '?', '[']) {
            return vec![pattern.to_path_buf()];
        }
        let (dir, pat) = match (pattern.parent(), pattern.file_name()) {
            (Some(d), Some(f)) => (d.to_path_buf(), f.to_string_lossy().into_owned()),
            _ => return Vec::new(),
        };
        let Ok(rd) = std::fs::read_dir(self.real(&dir)) else {
            return Vec::new();
        };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.') && wildcard(&pat, n))
            .map(|n| dir.join(n))
            .collect();
        v.sort();
        v
    }
}

fn wildcard(pat: &str, name: &str) -> bool {
    fn m(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], n) || (!n.is_empty() && m(p, &n[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &n[1..]),
            _ => false,
        }
    }
    m(pat.as_bytes(), name.as_bytes())
}

/// One directive of an nginx configuration, with its block if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Directive {
    /// Name (first word).
    pub name: String,
    /// Arguments, unquoted.
    pub args: Vec<String>,
    /// File it is written in.
    pub file: PathBuf,
    /// 1-based line of its name.
    pub line: u32,
    /// `{ ... }` contents, for block directives.
    pub block: Option<Vec<Directive>>,
}

#[derive(Debug, PartialEq)]
enum Tok {
    Word(String, u32),
    Semi(u32),
    Open(u32),
    Close(u32),
}

/// Splits nginx configuration text into words, `;`, `{` and `}` with line numbers.
fn tokenize(text: &str) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut line = 1u32;
    let mut chars = text.chars().peekable();
    let mut word = String::new();
    let mut word_line = 1;
    macro_rules! flush {
        () => {
            if !word.is_empty() {
                toks.push(Tok::Word(std::mem::take(&mut word), word_line));
            }
        };
    }
    while let Some(c) = chars.next() {
        match c {
            '\n' => {
                flush!();
                line += 1;
            }
            c if c.is_whitespace() => flush!(),
            '#' if word.is_empty() => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
            }
            ';' => {
                flush!();
                toks.push(Tok::Semi(line));
            }
            // `${name}` is a variable inside a word (nginx's own parser does the same),
            // not the start of a block.
            '{' if word.ends_with('$') => {
                word.push('{');
                for c in chars.by_ref() {
                    word.push(c);
                    if c == '}' {
                        break;
                    }
                }
            }
            '{' => {
                flush!();
                toks.push(Tok::Open(line));
            }
            '}' => {
                flush!();
                toks.push(Tok::Close(line));
            }
            '"' | '\'' if word.is_empty() => {
                let q = c;
                word_line = line;
                let mut s = String::new();
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some(n) = chars.next() {
                                if n == '\n' {
                                    line += 1;
                                }
                                s.push(n);
                            }
                        }
                        c if c == q => {
                            closed = true;
                            break;
                        }
                        '\n' => {
                            line += 1;
                            s.push('\n');
                        }
                        c => s.push(c),
                    }
                }
                if !closed {
                    return Err(format!("line {word_line}: unterminated quoted string"));
                }
                toks.push(Tok::Word(s, word_line));
            }
            '\\' => {
                if word.is_empty() {
                    word_line = line;
                }
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            c => {
                if word.is_empty() {
                    word_line = line;
                }
                word.push(c);
            }
        }
    }
    flush!();
    Ok(toks)
}

const MAX_INCLUDE_DEPTH: usize = 16;

/// Parses an nginx configuration file, following `include` (globs allowed; relative paths
/// are relative to the main file's directory, as nginx resolves them). Returns the
/// directives and notes about includes that could not be read.
pub fn parse_nginx(main: &Path, fs: &FsReader) -> Result<(Vec<Directive>, Vec<String>), String> {
    let conf_dir = main
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let mut notes = Vec::new();
    let tree = parse_file(main, fs, &conf_dir, &mut notes, 0)?;
    Ok((tree, notes))
}

fn parse_file(
    path: &Path,
    fs: &FsReader,
    conf_dir: &Path,
    notes: &mut Vec<String>,
    depth: usize,
) -> Result<Vec<Directive>, String> {
    if depth > MAX_INCLUDE_DEPTH {
        return Err(format!("{}: includes nested too deeply", path.display()));
    }
    let text = fs.read(path).map_err(|e| e.to_string())?;
    let toks = tokenize(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut pos = 0;
    let tree = parse_block(&toks, &mut pos, path, fs, conf_dir, notes, depth, false)?;
    Ok(tree)
}

#[allow(clippy::too_many_arguments)]
fn parse_block(
    toks: &[Tok],
    pos: &mut usize,
    file: &Path,
    fs: &FsReader,
    conf_dir: &Path,
    notes: &mut Vec<String>,
    depth: usize,
    nested: bool,
) -> Result<Vec<Directive>, String> {
    let mut out = Vec::new();
    let mut words: Vec<(String, u32)> = Vec::new();
    while *pos < toks.len() {
        let t = &toks[*pos];
        *pos += 1;
        match t {
            Tok::Word(w, l) => words.push((w.clone(), *l)),
            Tok::Semi(l) => {
                let Some((name, line)) = words.first().cloned() else {
                    return Err(format!("{}:{l}: unexpected \";\"", file.display()));
                };
                let args: Vec<String> = words.drain(..).skip(1).map(|w| w.0).collect();
                if name == "include" {
                    for a in &args {
                        let p = Path::new(a);
                        let p = if p.is_relative() {
                            conf_dir.join(p)
                        } else {
                            p.to_path_buf()
                        };
                        let files = fs.glob(&p);
                        if files.is_empty() && !a.contains(['*', '?']) {
                            notes
                                .push(format!("{}:{line}: include {a}: not found", file.display()));
                        }
                        for f in files {
                            match parse_file(&f, fs, conf_dir, notes, depth + 1) {
                                Ok(mut v) => out.append(&mut v),
                                Err(e) => notes.push(format!(
                                    "{}:{line}: include {}: {e}",
                                    file.display(),
                                    f.display()
                                )),
                            }
                        }
                    }
                } else {
                    out.push(Directive {
                        name,
                        args,
                        file: file.to_path_buf(),
                        line,
                        block: None,
                    });
                }
            }
            Tok::Open(l) => {
                let Some((name, line)) = words.first().cloned() else {
                    return Err(format!("{}:{l}: unexpected \"{{\"", file.display()));
                };
                let args: Vec<String> = words.drain(..).skip(1).map(|w| w.0).collect();
                let block = parse_block(toks, pos, file, fs, conf_dir, notes, depth, true)?;
                out.push(Directive {
                    name,
                    args,
                    file: file.to_path_buf(),
                    line,
                    block: Some(block),
                });
            }
            Tok::Close(l) => {
                if !nested {
                    return Err(format!("{}:{l}: unexpected \"}}\"", file.display()));
                }
                return Ok(out);
            }
        }
    }
    if nested {
        return Err(format!(
            "{}: unexpected end of file, expecting \"}}\"",
            file.display()
        ));
    }
    if let Some((w, l)) = words.first() {
        return Err(format!(
            "{}:{l}: directive \"{w}\" is not terminated by \";\"",
            file.display()
        ));
    }
    Ok(out)
}

fn listen_port(args: &[String]) -> Option<u16> {
    let a = args.first()?;
    if a.starts_with("unix:") {
        return None;
    }
    // "8080", "127.0.0.1:8080", "[::]:80", "*:80", "localhost" (port 80), "[::1]" (port 80)
    if let Some(rest) = a.strip_prefix('[') {
        return match rest.split_once("]:") {
            Some((_, p)) => p.parse().ok(),
            None => Some(80),
        };
    }
    let port = match a.rsplit_once(':') {
        Some((_, p)) => p,
        None if a.chars().all(|c| c.is_ascii_digit()) => a,
        None => "80",
    };
    port.parse().ok()
}

/// Effective values per scope: the http level, each server (with its listen ports) and each
/// location that overrides a directive. Inheritance: location ← server ← http ← default.
pub fn nginx_effective(tree: &[Directive], pid: u32) -> Vec<ConfigFinding> {
    let mut out = Vec::new();
    let find = |dirs: &[Directive], name: &str| -> Option<Directive> {
        dirs.iter().rev().find(|d| d.name == name).cloned()
    };
    for http in tree.iter().filter(|d| d.name == "http") {
        let hb = http.block.as_deref().unwrap_or(&[]);
        let mk = |scope: String, ports: Vec<u16>, name: &str, d: Option<&Directive>| {
            let default = NGINX_DIRECTIVES
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .unwrap_or("");
            ConfigFinding {
                software: "nginx".into(),
                pid,
                server: scope,
                ports,
                directive: name.into(),
                value: d
                    .map(|d| d.args.join(" "))
                    .unwrap_or_else(|| default.into()),
                file: d.map(|d| d.file.clone()),
                line: d.map(|d| d.line),
                default: d.is_none(),
            }
        };
        for (name, _) in NGINX_DIRECTIVES {
            out.push(mk("http".into(), vec![], name, find(hb, name).as_ref()));
        }
        for server in hb.iter().filter(|d| d.name == "server") {
            let sb = server.block.as_deref().unwrap_or(&[]);
            let mut ports: Vec<u16> = sb
                .iter()
                .filter(|d| d.name == "listen")
                .filter_map(|d| listen_port(&d.args))
                .collect();
            if ports.is_empty() {
                ports.push(80); // nginx's default listen (as root)
            }
            ports.sort_unstable();
            ports.dedup();
            let label = ports
                .iter()
                .map(|p| format!(":{p}"))
                .collect::<Vec<_>>()
                .join(",");
            let scope = format!("server {label}");
            for (name, _) in NGINX_DIRECTIVES {
                let d = find(sb, name).or_else(|| find(hb, name));
                out.push(mk(scope.clone(), ports.clone(), name, d.as_ref()));
            }
            // Locations (nested ones too: `location /a { location /a/b { ... } }`), each
            // reported where it overrides a directive.
            let mut stack: Vec<(&Directive, String)> = sb
                .iter()
                .filter(|d| d.name == "location")
                .map(|l| (l, String::new()))
                .collect();
            while let Some((loc, outer)) = stack.pop() {
                let lb = loc.block.as_deref().unwrap_or(&[]);
                let label = format!("location {}{outer}", loc.args.join(" "));
                for (name, _) in NGINX_DIRECTIVES {
                    if let Some(d) = find(lb, name) {
                        out.push(mk(
                            format!("{label} in {scope}"),
                            ports.clone(),
                            name,
                            Some(&d),
                        ));
                    }
                }
                for inner in lb.iter().filter(|d| d.name == "location") {
                    stack.push((inner, format!(" in {label}")));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_handles_quotes_comments_and_lines() {
        let t = tokenize("a 'b c';  # x { ;\n\"d\\\"e\" {\n}\n").unwrap();
        assert_eq!(
            t,
            vec![
                Tok::Word("a".into(), 1),
                Tok::Word("b c".into(), 1),
                Tok::Semi(1),
                Tok::Word("d\"e".into(), 2),
                Tok::Open(2),
                Tok::Close(3)
            ]
        );
        assert!(tokenize("a 'b;").is_err());
        assert_eq!(
            tokenize("set $p ${host}x;").unwrap(),
            vec![
                Tok::Word("set".into(), 1),
                Tok::Word("$p".into(), 1),
                Tok::Word("${host}x".into(), 1),
                Tok::Semi(1)
            ]
        );
    }

    #[test]
    fn includes_globs_and_effective_values() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("conf.d")).unwrap();
        std::fs::write(
            d.join("nginx.conf"),
            "worker_processes 1;\nevents { }\nhttp {\n    sendfile on;\n    include conf.d/*.conf;\n    include mime.types;\n}\n",
        )
        .unwrap();
        std::fs::write(
            d.join("conf.d/a.conf"),
            "server {\n  listen 8080;\n  tcp_nodelay off;\n  location /x { tcp_nodelay on; }\n}\n",
        )
        .unwrap();
        std::fs::write(d.join("conf.d/b.conf"), "server { listen [::]:81; }\n").unwrap();
        std::fs::write(d.join("conf.d/skip.txt"), "garbage {").unwrap();
        let fs = FsReader { root: None };
        let (tree, notes) = parse_nginx(&d.join("nginx.conf"), &fs).unwrap();
        assert!(notes.iter().any(|n| n.contains("mime.types")), "{notes:?}");
        let f = nginx_effective(&tree, 1);
        let get = |scope: &str, name: &str| {
            f.iter()
                .find(|x| x.server == scope && x.directive == name)
                .unwrap_or_else(|| panic!("{scope} {name}: {f:#?}"))
                .clone()
        };
        let n = get("server :8080", "tcp_nodelay");
        assert_eq!(n.value, "off");
        assert_eq!(n.file.as_deref(), Some(d.join("conf.d/a.conf").as_path()));
        assert_eq!(n.line, Some(3));
        assert!(!n.default);
        let s = get("server :8080", "sendfile");
        assert_eq!((s.value.as_str(), s.line), ("on", Some(4)));
        let g = get("server :81", "tcp_nodelay");
        assert!(g.default);
        assert_eq!(g.value, "on");
        assert_eq!(
            get("location /x in server :8080", "tcp_nodelay").value,
            "on"
        );
        assert_eq!(get("http", "tcp_nopush").value, "off");
    }

    /// Debian's stock layout (nginx.conf including modules-enabled, conf.d and
    /// sites-enabled) with realistic variations: quoted values, comments holding braces,
    /// `${var}` in an unquoted word, tcp_nodelay at http, server and (nested) location level,
    /// several servers on different ports, `listen [::]` without a port.
    #[test]
    fn debian_layout_per_port_effective_values() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["modules-enabled", "conf.d", "sites-enabled"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        let conf = format!(
            "user www-data;\nworker_processes auto;\npid /run/nginx.pid;\n\
             include {0}/modules-enabled/*.conf;\nevents {{\n\tworker_connections 768;\n}}\n\
             http {{\n\tsendfile on;\n\ttcp_nopush on;\n\ttcp_nodelay off; # was on {{ }}\n\
             \tinclude {0}/conf.d/*.conf;\n\tinclude {0}/sites-enabled/*;\n}}\n",
            d.display()
        );
        std::fs::write(d.join("nginx.conf"), conf).unwrap();
        std::fs::write(
            d.join("modules-enabled/50-mod.conf"),
            "load_module modules/x.so;\n",
        )
        .unwrap();
        std::fs::write(
            d.join("conf.d/log.conf"),
            "log_format main '$remote_addr \"$request\" {x}';\n",
        )
        .unwrap();
        std::fs::write(
            d.join("sites-enabled/default"),
            "server {\n\tlisten 80 default_server;\n\tlisten [::] default_server;\n\
             \tset $p ${host}x;\n\tlocation / {\n\t\ttry_files $uri $uri/ =404;\n\t}\n}\n",
        )
        .unwrap();
        std::fs::write(
            d.join("sites-enabled/api"),
            "server {\n  listen 127.0.0.1:8081;\n  tcp_nodelay \"on\";\n\
             \x20 location /a {\n    location /a/b { tcp_nodelay off; }\n  }\n}\n\
             server { listen 8082; keepalive_timeout 5s; }\n",
        )
        .unwrap();
        let (tree, notes) = parse_nginx(&d.join("nginx.conf"), &FsReader { root: None }).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        let f = nginx_effective(&tree, 1);
        let get = |scope: &str, name: &str| {
            f.iter()
                .find(|x| x.server == scope && x.directive == name)
                .unwrap_or_else(|| panic!("{scope} {name}: {f:#?}"))
                .clone()
        };
        let n = get("server :80", "tcp_nodelay");
        assert_eq!((n.value.as_str(), n.line), ("off", Some(11)));
        assert_eq!(n.file.as_deref(), Some(d.join("nginx.conf").as_path()));
        assert_eq!(n.ports, vec![80]);
        let n = get("server :8081", "tcp_nodelay");
        assert_eq!((n.value.as_str(), n.line), ("on", Some(3)));
        assert_eq!(get("server :8082", "tcp_nodelay").value, "off");
        assert_eq!(get("server :8082", "keepalive_timeout").value, "5s");
        assert_eq!(get("server :8082", "tcp_nopush").value, "on");
        let l = get(
            "location /a/b in location /a in server :8081",
            "tcp_nodelay",
        );
        assert_eq!((l.value.as_str(), l.line), ("off", Some(5)));
    }

    #[test]
    fn broken_config_is_an_error_with_position() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("n.conf"), "http {\n  sendfile on;\n").unwrap();
        let e = parse_nginx(&dir.path().join("n.conf"), &FsReader { root: None }).unwrap_err();
        assert!(e.contains("unexpected end of file"), "{e}");
        std::fs::write(dir.path().join("n.conf"), "a b\n").unwrap();
        let e = parse_nginx(&dir.path().join("n.conf"), &FsReader { root: None }).unwrap_err();
        assert!(e.contains(":1: directive \"a\""), "{e}");
    }

    #[test]
    fn nginx_argv_forms() {
        let a = vec!["nginx: master process /usr/sbin/nginx -c /tmp/x.conf -p /tmp/p".to_string()];
        assert_eq!(
            nginx_conf_from_args(&a),
            (Some("/tmp/x.conf".into()), Some("/tmp/p".into()))
        );
        let a: Vec<String> = ["nginx", "-c", "rel.conf"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(nginx_conf_from_args(&a), (Some("rel.conf".into()), None));
        assert_eq!(listen_port(&["[::]:8080".into()]), Some(8080));
        assert_eq!(
            listen_port(&["80".into(), "default_server".into()]),
            Some(80)
        );
        assert_eq!(listen_port(&["localhost".into()]), Some(80));
        assert_eq!(listen_port(&["[::]".into()]), Some(80));
        assert_eq!(
            listen_port(&["[::1]:8443".into(), "ssl".into()]),
            Some(8443)
        );
    }
}
