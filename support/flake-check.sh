#!/usr/bin/env bash
# Flake check: runs tests again and again and prints every failure with its output.
# Run it before landing a change to a verdict rule or a timing-sensitive test.
#
#   support/flake-check.sh suite [-n N] [--fresh-target]
#       N runs (default 3) of README.md's test command, one after the other.
#   support/flake-check.sh test TESTFILE [FILTER] [-n M] [--load K]
#       M runs (default 20) of one integration test binary (crates/lagtrace/tests/TESTFILE.rs;
#       FILTER selects tests by name as `cargo test` does), with K busy loops (default 0)
#       running for the whole check: a timing test must pass on a loaded machine too.
#
# Both test a clean clone of this repository's HEAD (committed work only), built once in
# its own target directory (/var/tmp/lagtrace-flake-target, kept between checks; with
# --fresh-target an empty one per run, as a new machine would), so editing or building the
# work tree meanwhile changes nothing under test. Prints one line per run (pass/FAIL,
# seconds, the closing `test result:` counts), the output of each failed run, and a summary
# `flake-check: P passed, F failed`. Exit 1 when any run failed. Needs root for the tests
# that build namespaces (as the test command itself).
#
# Nothing else may run on the machine meanwhile, niced or not: the lab's servers run in a
# session of their own, and with autogroup the scheduler shares a CPU between sessions
# first, so a `nice -n 19 cargo build` beside the check still takes half the CPU from the
# server a test measures (tests expecting `healthy` then rightly say cpu-contention). For
# the same reason `--load` is no use for a test whose control expects a CPU to itself
# (diagnose_host's cpu-contention test).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$HOME/.cargo/bin:$PATH"

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  exit 2
}

mode=${1:-}
[[ -n $mode ]] || usage
shift
runs=""
load=0
fresh=0
file=""
filter=""
while (($#)); do
  case $1 in
    -n) runs=${2:?-n needs a number}; shift 2 ;;
    --load) load=${2:?--load needs a number}; shift 2 ;;
    --fresh-target) fresh=1; shift ;;
    -h|--help) usage ;;
    -*) echo "flake-check: unknown flag $1" >&2; exit 2 ;;
    *)
      if [[ -z $file ]]; then file=$1; elif [[ -z $filter ]]; then filter=$1; else
        echo "flake-check: unexpected argument $1" >&2; exit 2
      fi
      shift ;;
  esac
done
[[ $runs =~ ^[0-9]+$ ]] || runs=""
[[ $load =~ ^[0-9]+$ ]] || { echo "flake-check: --load takes a number of busy loops" >&2; exit 2; }

work=$(mktemp -d /var/tmp/lagtrace-flake.XXXXXX)
# Readable by all, as a CI checkout is: some tests run the built binary as user nobody
# (mktemp's 0700 made them fail with EACCES, not the code under test).
chmod 755 "$work"
hogs=()
cleanup() {
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_hogs() {
  local i
  for ((i = 0; i < load; i++)); do
    (while :; do :; done) &
    hogs+=("$!")
  done
}

passed=0
failed=0
# one_run NAME DIR CMD: runs CMD in DIR, logs to $work/NAME.log, prints one line.
one_run() {
  local name=$1 dir=$2 cmd=$3 t0 t1 rc last
  t0=$(date +%s)
  (cd "$dir" && eval "$cmd") >"$work/$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  # One closing line for the whole run (cargo prints one per test binary).
  last=$(awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d ignored", p, f, i}' "$work/$name.log")
  if ((rc == 0)); then
    passed=$((passed + 1))
    printf '%s: pass  %5ss  %s\n' "$name" "$((t1 - t0))" "$last"
  else
    failed=$((failed + 1))
    printf '%s: FAIL  %5ss  %s (exit %s)\n' "$name" "$((t1 - t0))" "$last" "$rc"
    echo "---- $name: failed tests and their output ----"
    # cargo prints each failed test's output under `---- NAME stdout ----`, then `failures:`.
    awk '/^---- .* stdout ----$/ {on=1} /^failures:$/ && on {on=0} on' "$work/$name.log" | tail -n 400
    grep -E '^test .* FAILED$|^error' "$work/$name.log" | head -n 40
    echo "---- end of $name ----"
  fi
}

git -C "$here" clone -q --no-hardlinks "$here" "$work/clone" || exit 2
[[ -d $here/../shared ]] && ln -s "$here/../shared" "$work/shared"
target_for() { # target_for RUN: the target directory of that run
  if ((fresh)); then echo "$work/target-$1"; else echo "${FLAKE_TARGET:-/var/tmp/lagtrace-flake-target}"; fi
}
case $mode in
  suite)
    runs=${runs:-3}
    test_cmd=$(grep -m1 '^bash .ci/setup && cargo test' "$here/README.md")
    [[ -n $test_cmd ]] || { echo "flake-check: README.md has no test command" >&2; exit 2; }
    echo "flake-check: $runs run(s) of: $test_cmd (HEAD $(git -C "$here" rev-parse --short HEAD))" >&2
    for ((r = 1; r <= runs; r++)); do
      CARGO_TARGET_DIR=$(target_for "$r") one_run "run$r" "$work/clone" "$test_cmd"
      ((fresh)) && rm -rf "$(target_for "$r")"
    done
    ;;
  test)
    runs=${runs:-20}
    [[ -n $file ]] || usage
    [[ -f $work/clone/crates/lagtrace/tests/$file.rs ]] || {
      echo "flake-check: no crates/lagtrace/tests/$file.rs at HEAD" >&2
      exit 2
    }
    export CARGO_TARGET_DIR
    CARGO_TARGET_DIR=$(target_for 1)
    # Build once, before the load starts; then run the test binary itself, M times.
    (cd "$work/clone" && cargo build --release --locked --bin lagtrace -q) || exit 2
    bin=$(cd "$work/clone" && cargo test --release --locked -p lagtrace --test "$file" --no-run \
      --message-format=json 2>/dev/null | grep '"kind":\["test"\]' | grep "\"name\":\"$file\"" \
      | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
    [[ -x $bin ]] || { echo "flake-check: could not build tests/$file.rs" >&2; exit 2; }
    echo "flake-check: $runs run(s) of tests/$file.rs ${filter:+(filter $filter) }with $load busy loop(s) (HEAD $(git -C "$here" rev-parse --short HEAD))" >&2
    start_hogs
    for ((r = 1; r <= runs; r++)); do
      one_run "run$r" "$work/clone/crates/lagtrace" "$bin --include-ignored --test-threads=4 $filter"
    done
    ;;
  *) usage ;;
esac
echo "flake-check: $passed passed, $failed failed"
((failed == 0))
