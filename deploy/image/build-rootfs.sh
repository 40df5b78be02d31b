#!/usr/bin/env bash
# Builds the root filesystem of lagtrace's container image without any base image (no
# registry is needed): the release binary, exactly the shared libraries `ldd` lists for it
# (the dynamic loader included), /etc/passwd and /etc/group with root and nobody,
# /etc/nsswitch.conf (hosts: files dns) and /tmp. The tarball is reproducible (names sorted,
# mtime 0, owner 0): `Containerfile` adds it to FROM scratch, or `podman import` takes it.
#
# Usage: deploy/image/build-rootfs.sh [BINARY] [OUT.tar]
#   BINARY  default: $CARGO_TARGET_DIR/release/lagtrace (or target/release/lagtrace)
#   OUT     default: deploy/image/lagtrace-rootfs.tar
# As root it also runs the binary chrooted into the tree (no host library can be used
# there), so a missing library fails here rather than in a pod.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${1:-${CARGO_TARGET_DIR:-$repo/target}/release/lagtrace}
out=${2:-$here/lagtrace-rootfs.tar}
if [[ ! -x $bin ]]; then
  echo "build-rootfs: no executable at $bin (cargo build --release --locked --bin lagtrace)" >&2
  exit 2
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$bin" "$root/usr/bin/lagtrace"
# The release profile keeps line tables for backtraces; the image does without them.
if command -v strip >/dev/null; then strip --strip-debug "$root/usr/bin/lagtrace"; fi
# ldd: "libx.so => /path (addr)" for libraries, "/lib64/ld-linux-x86-64.so.2 (addr)" for the
# loader. Each is copied (symlinks resolved) under the path the loader will look for.
libs=$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
if [[ -z $libs ]]; then
  echo "build-rootfs: ldd lists no libraries for $bin (static? then only the binary is needed)" >&2
fi
for lib in $libs; do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
mkdir -p "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/:/nonexistent\nnobody:x:65534:65534:nobody:/:/nonexistent\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
if [[ $EUID -eq 0 ]]; then
  version=$(chroot "$root" /usr/bin/lagtrace --version) || {
    echo "build-rootfs: the binary does not run inside the tree (a library missing?)" >&2
    exit 1
  }
  echo "build-rootfs: $version runs alone in the tree" >&2
fi
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$out" .
echo "build-rootfs: wrote $out ($(du -h "$out" | cut -f1), $(tar -tf "$out" | grep -c '[^/]$') files)" >&2
