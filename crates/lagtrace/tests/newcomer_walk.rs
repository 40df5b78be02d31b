//! The newcomer's walk (issue 34), `support/newcomer-walk.sh`, run against this build: the
//! lab and its fix, pasteable fix lines, a cut capture, a server in another namespace, the
//! peers' flags, a URL without its scheme, the manual pages. Needs root (the lab).

use std::process::Command;

#[test]
#[ignore = "needs root"]
fn the_newcomer_walk_holds() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../support/newcomer-walk.sh"
    );
    // A verdict is part of the walk: our turn, as the other diagnosing tests.
    let _turn = lagtrace_testkit::measuring();
    let o = Command::new("bash")
        .arg(script)
        .env("LAGTRACE", env!("CARGO_BIN_EXE_lagtrace"))
        .output()
        .expect("bash");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("newcomer-walk: 0 failed"), "{out}");
    assert!(!out.contains("FAIL:"), "{out}");
}
