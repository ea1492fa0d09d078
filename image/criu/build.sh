#!/usr/bin/env bash
# Build and install CRIU 4.1.1 as /usr/local/sbin/criu: the project's own install path.
#
# Why: snapshot boot (`runc checkpoint`/`runc restore`) needs CRIU >= 4.1. Debian bookworm's
# criu 3.17.1 dies on newer kernels with "vdso: Unexpected rt vDSO area bounds" (CRIU issue
# 2532, fixed upstream in December 2024).
#
# What it does (docs/bundle.md, "CRIU"):
#   1. exits 0 at once if this build is already there: /usr/local/sbin/criu reports
#      version 4.1.1 with GitID v4.1.1-edge1 (a plain 4.1.1 lacks the patch and is rebuilt);
#   2. fetches Debian trixie's criu_4.1.1.orig.tar.xz with `apt-get source --download-only`
#      through a private apt directory (a deb-src entry for trixie; the host's sources and
#      lists are not touched) and refuses it unless its sha256 is the one below;
#   3. installs the build dependencies from the host's own apt sources (bookworm);
#   4. applies image/criu/patches/*.patch and runs `make -j$(nproc) criu` in a temporary
#      directory, with GitID v4.1.1-edge1 (22-26 s of make, about 30 s in all,
#      on the 2-core build host; allow a few minutes on a slow or loaded machine);
#   5. installs criu/criu as /usr/local/sbin/criu, which comes before /usr/sbin in root's PATH
#      and in systemd's default PATH (runc runs `criu` through a PATH lookup), marks the
#      shared libraries it links as manually installed (so `apt autoremove` keeps them), and
#      runs `criu check`, which must say "Looks good".
#
# Usage: image/criu/build.sh [--force]     (as root; --force rebuilds even when present)
# Environment:
#   CRIU_DEBIAN_MIRROR  Debian mirror serving trixie's sources (default http://deb.debian.org/debian)
#   CRIU_TARBALL        use this local criu_4.1.1.orig.tar.xz instead of downloading it
#                       (it is checked against the same sha256)
set -euo pipefail

VERSION=4.1.1
GITID=v$VERSION-edge1  # `criu --version` says "GitID: v4.1.1-edge1": this build, its patches applied
BUILT_VERSION="$VERSION $GITID"
PATCHES=$(cd "$(dirname "$0")" && pwd)/patches
TARBALL=criu_${VERSION}.orig.tar.xz
SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
DEST=/usr/local/sbin/criu
MIRROR=${CRIU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
BUILD_DEPS=(libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler libnl-3-dev libnet1-dev
            libcap-dev libbsd-dev libnftables-dev pkgconf python3-protobuf uuid-dev libgnutls28-dev
            build-essential xz-utils patch)
# The PATH root's login shells (ENV_SUPATH in /etc/login.defs) and systemd services get by default.
ROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

T0=$(date +%s)
STEP="start"
STEP_T0=$T0
log() { echo "criu-build: $*"; }
step() {
    local now; now=$(date +%s)
    [ "$STEP" = "start" ] || log "  done: $STEP ($((now - STEP_T0)) s)"
    STEP=$1; STEP_T0=$now
    log "[$((now - T0)) s] $STEP ..."
}
die() { echo "criu-build: FAILED: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc -eq 0 ] || echo "criu-build: FAILED (exit $rc) during: $STEP" >&2' EXIT

force=0
for arg in "$@"; do
    case $arg in
        --force) force=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (usage: $0 [--force])" ;;
    esac
done

# "4.1.1 v4.1.1-edge1" from `criu --version` ("Version: 4.1.1", then "GitID: ..." when built
# with one); empty when it does not run.
criu_version() { "$1" --version 2>/dev/null | sed -n 's/^Version: *//p; s/^GitID: *//p' | paste -sd' ' -; }

# ------------------------------------------------------------------ 1. already there?
if [ $force -eq 0 ] && [ -x "$DEST" ] && [ "$(criu_version "$DEST")" = "$BUILT_VERSION" ]; then
    log "CRIU $BUILT_VERSION is already installed at $DEST; nothing to do"
    on_path=$(command -v criu 2>/dev/null || true)
    [ "$on_path" = "$DEST" ] || log "  note: this PATH finds ${on_path:-no criu} first; runc started with it would use that one"
    exit 0
fi
if [ $force -eq 0 ]; then
    found=$(command -v criu 2>/dev/null || true)
    log "no CRIU $BUILT_VERSION at $DEST (PATH has: ${found:-none}${found:+ $(criu_version "$found")}); building it"
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (apt-get install, $DEST, criu check)"
export DEBIAN_FRONTEND=noninteractive

WORK=$(mktemp -d /tmp/criu-build.XXXXXX)
chmod 0755 "$WORK"
trap 'rc=$?; rm -rf "$WORK"; [ $rc -eq 0 ] || echo "criu-build: FAILED (exit $rc) during: $STEP" >&2' EXIT

# ------------------------------------------------------------------ 2. the source tarball
if [ -n "${CRIU_TARBALL:-}" ]; then
    step "using the local tarball $CRIU_TARBALL"
    [ -f "$CRIU_TARBALL" ] || die "CRIU_TARBALL=$CRIU_TARBALL: no such file"
    cp "$CRIU_TARBALL" "$WORK/$TARBALL"
else
    step "fetching Debian trixie's $TARBALL from $MIRROR (private apt directory)"
    APT="$WORK/apt"
    mkdir -p "$APT/sources.list.d" "$APT/lists/partial" "$APT/cache/archives/partial" "$WORK/src"
    cat > "$APT/sources.list.d/trixie-src.sources" <<SRC
Types: deb-src
URIs: $MIRROR
Suites: trixie
Components: main
Signed-By: $KEYRING
SRC
    apt_private=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$APT/sources.list.d"
                 -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache")
    apt-get "${apt_private[@]}" -qq update \
        || die "apt-get update of trixie's deb-src index from $MIRROR failed (is the mirror reachable?)"
    # The .dsc and .debian.tar.xz may be answered 404 by the mirror, and apt then exits
    # non-zero although the .orig.tar.xz arrived: judge by the tarball, not the exit code.
    chown _apt "$WORK/src" 2>/dev/null || true  # apt downloads as _apt where it can
    (cd "$WORK/src" && apt-get "${apt_private[@]}" -q source --download-only criu 2>&1 | sed 's/^/    apt: /') || true
    if [ ! -s "$WORK/src/$TARBALL" ]; then
        # trixie may have moved past 4.1.1: the pool keeps the file while a suite refers to it.
        got=$(cd "$WORK/src" && ls criu_*.orig.tar.* 2>/dev/null | tr '\n' ' ')
        log "apt-get source did not deliver $TARBALL (got: ${got:-nothing}); trying the pool directly"
        url="$MIRROR/pool/main/c/criu/$TARBALL"
        if command -v curl >/dev/null; then curl -fsSL -o "$WORK/src/$TARBALL" "$url" || true
        elif command -v wget >/dev/null; then wget -q -O "$WORK/src/$TARBALL" "$url" || true; fi
    fi
    [ -s "$WORK/src/$TARBALL" ] || die "could not fetch $TARBALL from $MIRROR (trixie deb-src)"
    mv "$WORK/src/$TARBALL" "$WORK/$TARBALL"
fi

step "checking the sha256 of $TARBALL"
got=$(sha256sum "$WORK/$TARBALL" | cut -d' ' -f1)
[ "$got" = "$SHA256" ] || die "sha256 mismatch for $TARBALL: got $got, expected $SHA256; refusing to build it"
log "  sha256 $got: as expected"

# ------------------------------------------------------------------ 3. build dependencies
step "installing the build dependencies"
missing=()
for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    log "  all ${#BUILD_DEPS[@]} already installed"
else
    log "  installing: ${missing[*]}"
    if ! apt-get install -y -qq "${missing[@]}" > "$WORK/apt.log" 2>&1; then
        log "  apt-get install failed; apt-get update, then again"
        apt-get update -qq || die "apt-get update failed"
        if ! apt-get install -y -qq "${missing[@]}" > "$WORK/apt.log" 2>&1; then
            tail -n 20 "$WORK/apt.log" >&2
            die "apt-get install ${missing[*]} failed (last 20 lines above)"
        fi
    fi
fi

# ------------------------------------------------------------------ 4. build
step "unpacking"
tar -xJf "$WORK/$TARBALL" -C "$WORK"
SRCDIR=$(find "$WORK" -mindepth 1 -maxdepth 1 -type d -name 'criu-*' | head -n1)
[ -n "$SRCDIR" ] && [ -f "$SRCDIR/Makefile" ] || die "no criu-*/Makefile in $TARBALL"

for patch in "$PATCHES"/*.patch; do
    step "applying $(basename "$patch")"
    patch -d "$SRCDIR" -p1 --forward --quiet < "$patch" || die "$(basename "$patch") does not apply to $VERSION"
done

jobs=$(nproc)
step "make -j$jobs criu (about 30 s on 2 cores, minutes on a slow machine)"
if ! make -C "$SRCDIR" -j"$jobs" GITID="$GITID" criu > "$WORK/make.log" 2>&1; then
    tail -n 40 "$WORK/make.log" >&2
    die "make criu failed (last 40 lines above)"
fi
[ -x "$SRCDIR/criu/criu" ] || die "make succeeded but $SRCDIR/criu/criu is missing"
built=$(criu_version "$SRCDIR/criu/criu")
[ "$built" = "$BUILT_VERSION" ] || die "the built criu reports version '${built:-?}', expected $BUILT_VERSION"

# ------------------------------------------------------------------ 5. install and check
step "installing $DEST"
install -D -m 0755 "$SRCDIR/criu/criu" "$DEST.new"
mv -f "$DEST.new" "$DEST"
# The runtime libraries came in as dependencies of the -dev packages: keep them if those go.
libs=$(ldd "$DEST" | awk '$3 ~ /^\// {print $3}')
pkgs=$(for l in $libs; do dpkg -S "$(readlink -f "$l")" 2>/dev/null || dpkg -S "$l" 2>/dev/null || true; done \
       | cut -d: -f1 | sort -u | tr '\n' ' ')
[ -z "$pkgs" ] || apt-mark manual $pkgs >/dev/null || log "  (apt-mark manual failed; not fatal)"

step "criu check"
resolved=$(PATH=$ROOT_PATH command -v criu)
[ "$resolved" = "$DEST" ] || die "with root's default PATH ($ROOT_PATH) \`criu\` resolves to $resolved, not $DEST"
if ! out=$("$DEST" check 2>&1); then
    echo "$out" | sed 's/^/    /' >&2
    die "criu check failed"
fi
echo "$out" | sed 's/^/    /'
echo "$out" | grep -q "Looks good" || die "criu check did not say \"Looks good\""
now_path=$(command -v criu || true)
if [ "$now_path" != "$DEST" ]; then
    log "  note: this shell's PATH finds ${now_path:-no criu} first; runc started from it would use that one"
fi

log "  done: $STEP ($(( $(date +%s) - STEP_T0 )) s)"
log "CRIU $("$DEST" --version | sed -n 's/^Version: *//p') installed at $DEST in $(( $(date +%s) - T0 )) s"
