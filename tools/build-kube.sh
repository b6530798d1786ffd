#!/usr/bin/env bash
# Build (or reuse) a real kube-apiserver 1.20.2 and etcd 3.4 for the `kube_real` test tier
# (tests/realkube), from Debian packages only: no Docker, no cluster, no prebuilt download.
#
#   make kube-binaries          # or: bash tools/build-kube.sh
#
# The binaries land in a cache outside the repository, shared by every clone on the
# machine:
#
#   ${TPU_AUTOSCALER_KUBE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tpu-autoscaler/kube-1.20.2}/
#       bin/kube-apiserver      built here (CGO off, a static binary of about 110 MB)
#       bin/etcd                a symlink to Debian's etcd-server binary
#       BUILD_INFO              versions and how long the build took
#       build/                  source and Go build cache, removed after a successful
#                               build unless TPU_AUTOSCALER_KUBE_KEEP_BUILD is set
#
# A second run finds both and exits in well under a second. The first run needs root
# (apt-get), the Debian mirror, about 2 GB of disk and 5 to 15 minutes on 2 cores:
#   1. apt-get install etcd-server golang-go golang-github-modern-go-reflect2-dev dpkg-dev,
#      after adding deb-src entries mirroring the configured deb ones (for step 2);
#   2. apt-get source kubernetes (Debian's 1.20.2), unpacked under the cache;
#   3. three fixes, without which the source package does not build or does not run:
#      - GOPATH mode (GO111MODULE=off, the tree linked under
#        $GOPATH/src/k8s.io/kubernetes, as its own hack/lib/init.sh does);
#      - pkg/generated/openapi generated with the vendored openapi-gen (the source
#        package lacks it: "undefined: openapi.GetOpenAPIDefinitions");
#      - the vendored github.com/modern-go/reflect2 1.0.1 replaced by Debian's 1.0.2
#        (1.0.1 faults under Go >= 1.18 on the first custom-resource write);
#   4. go build k8s.io/kubernetes/cmd/kube-apiserver, under nice.
# Every failure that is not a build error prints one line saying why and exits non-zero.
set -euo pipefail

KUBE_VERSION=1.20.2
CACHE_DIR="${TPU_AUTOSCALER_KUBE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tpu-autoscaler/kube-$KUBE_VERSION}"
BIN_DIR="$CACHE_DIR/bin"
WORK_DIR="$CACHE_DIR/build"
PACKAGES=(etcd-server golang-go golang-github-modern-go-reflect2-dev dpkg-dev)
REFLECT2_DEBIAN=/usr/share/gocode/src/github.com/modern-go/reflect2
APT_LOCK=(-o DPkg::Lock::Timeout=600)

say() { echo "kube-binaries: $*"; }
die() {
    echo "kube-binaries: $*" >&2
    exit 1
}

etcd_path() { command -v etcd 2>/dev/null || { test -x /usr/bin/etcd && echo /usr/bin/etcd; }; }

up_to_date() {
    test -x "$BIN_DIR/kube-apiserver" && test -x "$BIN_DIR/etcd" && test -f "$CACHE_DIR/BUILD_INFO"
}

report_up_to_date() {
    say "up to date in $CACHE_DIR ($(tr '\n' ' ' <"$CACHE_DIR/BUILD_INFO" | sed 's/ *$//'))"
}

if up_to_date; then
    report_up_to_date
    exit 0
fi
# One build at a time per cache (two clones, or CI beside a developer).
mkdir -p "$(dirname "$CACHE_DIR")" 2>/dev/null || die "cannot create $(dirname "$CACHE_DIR")"
exec 9>"$CACHE_DIR.lock" || die "cannot write $CACHE_DIR.lock"
if command -v flock >/dev/null; then
    flock -n 9 || { say "another build holds $CACHE_DIR.lock; waiting"; flock 9; }
fi
if up_to_date; then
    report_up_to_date
    exit 0
fi

started=$(date +%s)

# --- 1. packages ---------------------------------------------------------------------
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$package")
done
# A built kube-apiserver whose etcd went away (etcd-server removed) is kept.
have_apiserver=0
"$BIN_DIR/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes v$KUBE_VERSION" && have_apiserver=1
need_source=1
if ((have_apiserver)) || test -d "$WORK_DIR/kubernetes/cmd/kube-apiserver"; then need_source=0; fi
if ((${#missing[@]} > 0 || need_source)); then
    command -v apt-get >/dev/null || die "no apt-get here: install ${PACKAGES[*]} and Debian's kubernetes $KUBE_VERSION source by other means, or point TPU_AUTOSCALER_KUBE_DIR at a cache built elsewhere"
    test "$(id -u)" -eq 0 || die "must run as root (it installs Debian packages and fetches Debian's kubernetes source with apt-get): run 'sudo make kube-binaries', or copy a built $CACHE_DIR here"
fi
need_update=$((${#missing[@]} > 0))
if ((need_source)) && ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
    # deb-src twins of the configured Debian deb entries (deb822 and one-line styles).
    say "adding deb-src entries beside the deb ones"
    src_list=/etc/apt/sources.list.d/tpu-autoscaler-deb-src
    : >"$src_list.tmp"
    for sources in /etc/apt/sources.list.d/*.sources; do
        test -f "$sources" && grep -q 'debian' "$sources" || continue
        case "$sources" in "$src_list"*) continue ;; esac
        sed -e 's/^Types:.*/Types: deb-src/' "$sources" >>"$src_list.tmp"
        echo >>"$src_list.tmp"
    done
    test -s "$src_list.tmp" && mv "$src_list.tmp" "$src_list.sources" || rm -f "$src_list.tmp"
    if [ -f /etc/apt/sources.list ] && grep -q '^deb .*debian' /etc/apt/sources.list; then
        grep '^deb .*debian' /etc/apt/sources.list | sed 's/^deb /deb-src /' >"$src_list.list"
    fi
    need_update=1
fi
if ((need_update)); then
    say "apt-get update"
    log=$(mktemp)
    apt-get "${APT_LOCK[@]}" update -qq >"$log" 2>&1 ||
        die "apt-get update failed (no network or no Debian mirror?): $(grep -v '^$' "$log" | tail -n 1)"
    rm -f "$log"
fi
if ((${#missing[@]} > 0)); then
    say "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get "${APT_LOCK[@]}" install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
fi
ETCD=$(etcd_path) || die "etcd-server is installed but no etcd binary was found"
test -d "$REFLECT2_DEBIAN" || die "$REFLECT2_DEBIAN is missing (golang-github-modern-go-reflect2-dev)"
command -v go >/dev/null || die "golang-go is installed but 'go' is not on PATH"

# --- 2. source -------------------------------------------------------------------------
fetch_source() {
    if ((need_source)); then
        say "apt-get source kubernetes"
        rm -rf "$WORK_DIR/src" && mkdir -p "$WORK_DIR/src"
        (cd "$WORK_DIR/src" && apt-get source -qq kubernetes >/dev/null 2>&1) ||
            die "apt-get source kubernetes failed (no deb-src entries, or no network?)"
        tree=$(find "$WORK_DIR/src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)
        test -n "$tree" || die "apt-get source kubernetes unpacked no kubernetes-* directory"
        grep -q "gitVersion.*v$KUBE_VERSION\|$KUBE_VERSION" "$tree/debian/changelog" ||
            die "Debian's kubernetes source is not $KUBE_VERSION: $(head -n 1 "$tree/debian/changelog")"
        rm -rf "$WORK_DIR/kubernetes"
        mv "$tree" "$WORK_DIR/kubernetes"
        rm -rf "$WORK_DIR/src"
    fi
}

# --- 3. fixes --------------------------------------------------------------------------
fix_source() {
    export GOPATH="$WORK_DIR/gopath" GOCACHE="$WORK_DIR/gocache" GO111MODULE=off CGO_ENABLED=0
    export GOFLAGS=
    mkdir -p "$GOPATH/src/k8s.io"
    ln -sfn "$WORK_DIR/kubernetes" "$GOPATH/src/k8s.io/kubernetes"
    KUBE="$GOPATH/src/k8s.io/kubernetes"
    PKG=k8s.io/kubernetes

    # reflect2 1.0.1 -> Debian's 1.0.2
    vendored="$KUBE/vendor/github.com/modern-go/reflect2"
    if ! cmp -s "$REFLECT2_DEBIAN/reflect2.go" "$vendored/reflect2.go"; then
        say "vendored reflect2 replaced by Debian's ($(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev))"
        rm -rf "$vendored"
        cp -rL "$REFLECT2_DEBIAN" "$vendored"
        find "$vendored" -name '*_test.go' -delete
    fi

    # pkg/generated/openapi, as build/root/Makefile.generated_files makes it: the directories
    # of the tree's Go files (vendor/ aside, staging/src/X named vendor/X) holding a file with
    # a `// +k8s:` tag and `+k8s:openapi-gen=`, code-generator and sample-apiserver aside.
    openapi="$KUBE/pkg/generated/openapi/zz_generated.openapi.go"
    if ! grep -q 'k8s.io/api/core/v1.Pod"' "$openapi" 2>/dev/null; then
        say "generating pkg/generated/openapi"
        (cd "$KUBE" && nice go build -o "$WORK_DIR/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen) ||
            die "go build of the vendored openapi-gen failed"
        dirs=$(cd "$WORK_DIR/kubernetes" &&
            find . \( -path ./_\* -o -path './.*' -o -path ./vendor -o -path ./debian \) -prune -o \
                -type f -name '*.go' -print |
            xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' |
            sed -e 's#^\./##' -e 's#^staging/src/#vendor/#' -e 's#/[^/]*$##' |
            grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' |
            LC_ALL=C sort -u | sed "s#^#$PKG/#" | paste -sd, -)
        test -n "$dirs" || die "found no package tagged +k8s:openapi-gen="
        (cd "$KUBE" && nice "$WORK_DIR/openapi-gen" \
            --input-dirs "$dirs" \
            --output-package "$PKG/pkg/generated/openapi" \
            --output-base "$GOPATH/src" \
            --output-file-base zz_generated.openapi \
            --go-header-file vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
            --report-filename "$WORK_DIR/openapi-violations.report" >/dev/null) ||
            die "openapi-gen failed"
        grep -q 'k8s.io/api/core/v1.Pod"' "$openapi" ||
            die "openapi-gen wrote no definition of core/v1 Pod in $openapi"
    fi
}

# --- 4. build --------------------------------------------------------------------------
build_apiserver() {
    say "go build $PKG/cmd/kube-apiserver (nice; several minutes on 2 cores)"
    # The version the binary and its /version report, set as hack/lib/version.sh sets it.
    ldflags="-s -w"
    for version_pkg in "$PKG/vendor/k8s.io/component-base/version" "$PKG/vendor/k8s.io/client-go/pkg/version"; do
        ldflags+=" -X $version_pkg.gitVersion=v$KUBE_VERSION -X $version_pkg.gitMajor=1"
        ldflags+=" -X $version_pkg.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
        ldflags+=" -X $version_pkg.gitTreeState=clean -X $version_pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    (cd "$KUBE" && nice go build -ldflags "$ldflags" -o "$BIN_DIR/kube-apiserver.tmp" "$PKG/cmd/kube-apiserver") ||
        die "go build of kube-apiserver failed (see above)"
    "$BIN_DIR/kube-apiserver.tmp" --version >/dev/null || die "the built kube-apiserver does not run"
    mv "$BIN_DIR/kube-apiserver.tmp" "$BIN_DIR/kube-apiserver"
}

mkdir -p "$WORK_DIR" "$BIN_DIR"
if ((have_apiserver)); then
    say "kube-apiserver v$KUBE_VERSION already built in $BIN_DIR"
else
    fetch_source
    fix_source
    build_apiserver
fi
ln -sfn "$ETCD" "$BIN_DIR/etcd"

elapsed=$(($(date +%s) - started))
{
    echo "$("$BIN_DIR/kube-apiserver" --version)"
    echo "etcd $("$BIN_DIR/etcd" --version | sed -n 's/^etcd Version: //p')"
    echo "go $(go version | cut -d' ' -f3)"
    if ((have_apiserver)); then
        echo "done in ${elapsed}s (kube-apiserver kept from an earlier build)"
    elif ((need_source)); then
        echo "built in ${elapsed}s (source fetched)"
    else
        echo "built in ${elapsed}s (source kept from an earlier build)"
    fi
} >"$CACHE_DIR/BUILD_INFO.tmp"
mv "$CACHE_DIR/BUILD_INFO.tmp" "$CACHE_DIR/BUILD_INFO"
# The source tree and Go's build cache (about 1.4 GB) serve only a rebuild.
test -n "${TPU_AUTOSCALER_KUBE_KEEP_BUILD:-}" || rm -rf "$WORK_DIR"
say "done in ${elapsed}s: $BIN_DIR/kube-apiserver, $BIN_DIR/etcd -> $ETCD"
