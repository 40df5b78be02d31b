#!/usr/bin/env bash
# Runs a command as root in a VM booted on a stock distribution kernel (issue 30), over this
# machine's root filesystem (read-only, through virtme-ng), and returns its exit status.
#
# usage: support/vm-run.sh [--kernel PKG] [--timeout S] [--dir DIR] -- CMD [ARG...]
#
#   --kernel PKG  a Debian kernel image package (default: the one linux-image-amd64 depends
#                 on, Debian 12's 6.1); downloaded with apt-get and unpacked with dpkg-deb
#                 -x under the state directory — never installed into this host's /boot
#   --timeout S   the whole VM run (default 600); exit 124 when it runs out
#   --dir DIR     a host directory the guest can write (default: a new temporary one): the
#                 only place guaranteed visible read-write in the guest. Copy binaries there:
#                 not every host path is visible in the guest (a build's target directory
#                 under /var/tmp was not, here).
#
# The command runs in the guest with /bin/sh from DIR; its stdout and stderr are printed
# after the VM stops, and its exit status is this script's. KVM is used where a KVM guest
# boots (tried once per kernel, the answer kept in the state directory); TCG otherwise — on
# this machine, a paravirtualised guest itself, a KVM guest hangs after "Probing EDD".
#
# First run installs what it needs: qemu-system-x86, busybox-static, kmod, python3-venv (apt)
# and virtme-ng (PyPI, in a venv under the state directory, $LAGTRACE_VM_STATE or
# /var/cache/lagtrace-vm).
set -euo pipefail

KPKG=""
TIMEOUT=600
DIR=""
while (($#)); do
    case "$1" in
        --kernel) KPKG=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "vm-run: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
(($#)) || { echo "vm-run: no command given (usage: support/vm-run.sh [OPTIONS] -- CMD)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "vm-run: needs root (apt-get, /dev/kvm, virtiofsd)" >&2; exit 2; }

STATE=${LAGTRACE_VM_STATE:-/var/cache/lagtrace-vm}
mkdir -p "$STATE"
export PATH="$STATE/venv/bin:$PATH:/usr/sbin:/sbin"

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
    echo "vm-run: installing ${need[*]}" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [[ ! -x $STATE/venv/bin/vng ]]; then
    echo "vm-run: installing virtme-ng in $STATE/venv" >&2
    python3 -m venv "$STATE/venv"
    "$STATE/venv/bin/pip" install -q virtme-ng
fi

if [[ -z $KPKG ]]; then
    KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [[ -n $KPKG ]] || { echo "vm-run: no kernel package behind linux-image-amd64 (apt-get update?)" >&2; exit 2; }
fi
KDIR=$STATE/kernels/$KPKG
if [[ ! -d $KDIR/boot ]]; then
    echo "vm-run: fetching $KPKG" >&2
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download "$KPKG" 2>/dev/null) || { apt-get update -qq >/dev/null; (cd "$tmp" && apt-get download "$KPKG" 2>/dev/null); }
    mkdir -p "$KDIR"
    dpkg-deb -x "$tmp"/*.deb "$KDIR"
    rm -rf "$tmp"
fi
VMLINUZ=$(ls "$KDIR"/boot/vmlinuz-* | head -1)

own_dir=0
if [[ -z $DIR ]]; then
    DIR=$(mktemp -d /var/tmp/lagtrace-vm-run.XXXXXX)
    own_dir=1
fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
cleanup() { ((own_dir)) && rm -rf "$DIR"; return 0; }
trap cleanup EXIT
rm -f "$DIR/.rc" "$DIR/.out"
{
    echo '#!/bin/sh'
    printf '%q ' "$@"
    echo "> $DIR/.out 2>&1"
    echo "echo \$? > $DIR/.rc"
} > "$DIR/.script"
chmod +x "$DIR/.script"

# KVM where a guest boots: tried once per kernel with a short timeout, the answer kept.
accel=(--disable-kvm)
if [[ -e /dev/kvm && ${LAGTRACE_VM_TCG:-0} != 1 ]]; then
    mark=$STATE/kvm-$KPKG
    if [[ ! -e $mark ]]; then
        if timeout 60 vng --run "$VMLINUZ" --user root --exec true >/dev/null 2>&1; then
            echo yes > "$mark"
        else
            echo no > "$mark"
        fi
    fi
    [[ $(cat "$mark") == yes ]] && accel=()
fi

set +e
# The kernel's modules (virtme links /lib/modules/VERSION to them) shared explicitly: the
# guest mounts its own /var, so nothing under this host's /var is visible otherwise.
timeout "$TIMEOUT" vng -v "${accel[@]}" --rodir "$KDIR" --rwdir "$DIR" --run "$VMLINUZ" --user root \
    --exec "$DIR/.script" > "$DIR/.console" 2>&1
vrc=$?
set -e
[[ -f $DIR/.out ]] && cat "$DIR/.out"
if ((vrc == 124)); then
    echo "vm-run: the VM ran out of its ${TIMEOUT}s" >&2
    exit 124
fi
if [[ ! -f $DIR/.rc ]]; then
    echo "vm-run: the command did not finish in the VM (vng exit $vrc); its console:" >&2
    tail -20 "$DIR/.console" >&2
    exit 125
fi
exit "$(cat "$DIR/.rc")"
