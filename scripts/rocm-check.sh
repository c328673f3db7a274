#!/usr/bin/env bash
# Real ROCm, no GPU: checks duet's HIP backend against Debian's ROCm 6.4 (unstable) and 7.2
# (experimental) packages, each in a minimal Debian root made with debootstrap.
#
#   scripts/rocm-check.sh            # both versions
#   DUET_ROCM_VERSIONS=7.2 scripts/rocm-check.sh
#
# Per version:
#  1. every kernels-hip module compiled through duet's own hiprtc path (the example
#     crates/hip/examples/rocm_check.rs, run inside the root) for gfx942, gfx950 and gfx90a, one
#     line per kernel with VGPR/AGPR/SGPR/LDS/scratch/spills from the code objects' metadata;
#     gfx1250 is compiled too as a newer target, and a target the compiler does not know is
#     reported as UNKNOWN-TARGET (not a failure);
#  2. every symbol duet loads resolved (dlopen) in libamdhip64, libhiprtc, librocBLAS,
#     libhipBLASLt and librccl (the tables read from the code), and duet's hand-written constants
#     and struct layouts compared with the real headers by a compiled C++ probe
#     (scripts/rocm/probe.py generates it from the Rust sources);
#  3. the HIP runtime / hiprtc bindings regenerated with bindgen from that version's headers and
#     compared with the committed ones (generated from 6.4.3: a difference on 6.4 fails, one on 7.2
#     is reported);
#  4. `duet info` and `duet train --backend hip` run in the root: they must end with the clean
#     no-device error (nonzero exit for train, no panic, no signal).
# Versions are pinned (exact Debian versions below). A pinned package that has left the archive
# gives a SKIP line naming it, not a failure. Downloads and roots are cached in $DUET_ROCM_CACHE
# (default /var/cache/duet-rocm-check, else target/rocm-check); a second run reuses them.
# Needs root (debootstrap, chroot), network, and on the host: debootstrap, g++, libclang-dev.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export CARGO_TERM_COLOR=never
MIRROR=${DUET_ROCM_MIRROR:-http://deb.debian.org/debian}
VERSIONS=${DUET_ROCM_VERSIONS:-"6.4 7.2"}
ARCHS="gfx942:sramecc+:xnack- gfx950 gfx90a:sramecc+:xnack- gfx1250"
# Targets a version may not know (reported, not a failure): version:target.
MAY_BE_UNKNOWN=${DUET_ROCM_MAY_BE_UNKNOWN-6.4:gfx1250}
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

CACHE=${DUET_ROCM_CACHE:-/var/cache/duet-rocm-check}
if ! { $SUDO mkdir -p "$CACHE" && $SUDO test -w "$CACHE"; } 2>/dev/null; then
  CACHE="$REPO/target/rocm-check"
  mkdir -p "$CACHE"
fi
echo "rocm-check: cache $CACHE, versions $VERSIONS"

# ---- pinned packages, per version: suite, installed in the root (apt), extracted libraries
# (only their lib*.so* files, for dlopen: rocBLAS alone is 4 GB installed), headers (-dev,
# dpkg-deb -x), and what is known to be absent.
pins() {
  case "$1" in
    6.4)
      SUITE_EXTRA=""
      INSTALL="libamdhip64-6=6.4.3-5 libhiprtc6=6.4.3-5 libhiprtc-builtins6=6.4.3-5
               libamdhip64-dev=6.4.3-5 libamd-comgr3=7.0.2+dfsg-3 libroctx64-4=6.4.1-1"
      EXTRACT="librocblas4=6.4.4-4 libhipblaslt1=7.1.1+dfsg-4"
      HEADERS="libamdhip64-dev=6.4.3-5 libhsa-runtime-dev=6.4.3+dfsg-5 librocblas-dev=6.4.4-4
               libhipblaslt-dev=7.1.1+dfsg-4 libhipblas-common-dev=7.1.0-1+b1"
      ABSENT="librccl1 (unstable's RCCL 5.4.3 depends on HIP 5 and does not install beside HIP 6)"
      ;;
    7.2)
      SUITE_EXTRA="experimental"
      INSTALL="libamdhip64-7=7.2.4-1~exp2 libhiprtc7=7.2.4-1~exp2 libhiprtc-builtins7=7.2.4-1~exp2
               libamdhip64-dev=7.2.4-1~exp2 libamd-comgr3=7.2.4+dfsg-1~exp1
               libroctx64-4=7.2.4-1~exp1 librocm-smi64-7=7.2.4-1~exp1"
      EXTRACT="librocblas5=7.2.4-1~exp1 libhipblaslt1=7.2.4+dfsg-1~exp1 librccl1=7.2.4-1~exp3"
      HEADERS="libamdhip64-dev=7.2.4-1~exp2 libhsa-runtime-dev=7.2.4+dfsg-1~exp1
               librocblas-dev=7.2.4-1~exp1 libhipblaslt-dev=7.2.4+dfsg-1~exp1
               libhipblas-common-dev=7.2.4-1~exp1 librccl-dev=7.2.4-1~exp3"
      ABSENT=""
      ;;
    *) echo "unknown ROCm version $1" >&2; return 1 ;;
  esac
  # shellcheck disable=SC2086
  INSTALL=$(echo $INSTALL) EXTRACT=$(echo $EXTRACT) HEADERS=$(echo $HEADERS)
}

FAILS=()
SKIPS=()
fail() { echo "FAIL: $*"; FAILS+=("$*"); }
skip() { echo "SKIP: $*"; SKIPS+=("$*"); }

# ---- host tools
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v g++ >/dev/null || need+=(g++)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)  # bindgen: libclang + its headers
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# ---- duet binaries, built on the host (glibc 2.36) and run inside the roots (newer glibc).
t0=$SECONDS
cargo build --release -p duet-hip --example rocm_check -q || { echo "FAIL: building rocm_check"; exit 1; }
cargo build --release --bin duet -q || { echo "FAIL: building duet"; exit 1; }
TD=${CARGO_TARGET_DIR:-$REPO/target}
echo "built rocm_check and duet in $((SECONDS - t0)) s"

# ---- the base root (debootstrap minbase sid), made once and copied per version.
mounted=()
cleanup() { for m in "${mounted[@]}"; do $SUDO umount -l "$m" 2>/dev/null; done; }
trap cleanup EXIT
base="$CACHE/base-sid"
if [ ! -e "$base/.duet-ok" ]; then
  t0=$SECONDS
  $SUDO rm -rf "$base"
  if ! $SUDO debootstrap --variant=minbase sid "$base" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1; then
    tail -20 "$CACHE/debootstrap.log"
    skip "debootstrap of sid failed (log $CACHE/debootstrap.log): no ROCm checks"
    printf '%s\n' "${SKIPS[@]}"
    exit 0
  fi
  $SUDO touch "$base/.duet-ok"
  echo "debootstrap sid: $((SECONDS - t0)) s, $(du -sh "$base" | cut -f1)"
fi

APT_OPTS=(-o Acquire::Check-Valid-Until=false -o APT::Get::AllowUnauthenticated=false)

check_version() {
  local v=$1
  pins "$v" || return 1
  local root="$CACHE/root-$v" hdr="$CACHE/headers-$v" debs="$CACHE/debs-$v"
  local stamp
  stamp=$(echo "$INSTALL $EXTRACT $HEADERS $SUITE_EXTRA" | tr -s ' \n' ' ' | md5sum | cut -c1-12)
  in_root() { $SUDO chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
  echo "=== ROCm $v (root $root)"
  local t0=$SECONDS
  if [ "$(cat "$root/.duet-stamp" 2>/dev/null)" != "$stamp" ]; then
    $SUDO rm -rf "$root" "$hdr"
    $SUDO cp -a "$base" "$root"
    if [ -n "$SUITE_EXTRA" ]; then
      echo "deb $MIRROR $SUITE_EXTRA main" | $SUDO tee "$root/etc/apt/sources.list.d/$SUITE_EXTRA.list" >/dev/null
    fi
    if ! in_root apt-get "${APT_OPTS[@]}" update -qq >"$CACHE/apt-$v.log" 2>&1; then
      tail -5 "$CACHE/apt-$v.log"; skip "ROCm $v: apt-get update failed in the root"; return 0
    fi
    # A pinned version no longer in the archive: SKIP naming it.
    local p gone=()
    for p in $INSTALL $EXTRACT $HEADERS; do
      if ! in_root apt-cache madison "${p%%=*}" 2>/dev/null | awk -F'|' '{gsub(/ /,"",$2); print $2}' | grep -qxF "${p#*=}"; then
        gone+=("$p")
      fi
    done
    if [ ${#gone[@]} -gt 0 ]; then
      skip "ROCm $v: pinned packages no longer in the archive: ${gone[*]}"
      return 0
    fi
    local extra=()
    [ -n "$SUITE_EXTRA" ] && extra=(-t "$SUITE_EXTRA")
    # shellcheck disable=SC2086
    if ! in_root env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y -qq \
        --no-install-recommends "${extra[@]}" $INSTALL >>"$CACHE/apt-$v.log" 2>&1; then
      tail -20 "$CACHE/apt-$v.log"; fail "ROCm $v: installing $INSTALL"; return 0
    fi
    # Libraries: only lib*.so* from each package, unpacked into the root's lib folder.
    $SUDO mkdir -p "$root/tmp/debs" "$hdr"
    $SUDO chmod 777 "$root/tmp/debs"
    # shellcheck disable=SC2086
    if ! in_root sh -c "cd /tmp/debs && apt-get ${APT_OPTS[*]} download -qq $EXTRACT $HEADERS" >>"$CACHE/apt-$v.log" 2>&1; then
      tail -20 "$CACHE/apt-$v.log"; fail "ROCm $v: apt-get download"; return 0
    fi
    for p in $EXTRACT; do
      local f
      f=$(ls "$root/tmp/debs/${p%%=*}_"*.deb) || { fail "ROCm $v: $p was not downloaded"; return 0; }
      if ! dpkg-deb --fsys-tarfile "$f" | $SUDO tar -x -C "$root" --no-wildcards-match-slash \
          --wildcards './usr/lib/x86_64-linux-gnu/lib*.so*' || [ "${PIPESTATUS[0]}" -ne 0 ]; then
        fail "ROCm $v: unpacking $p"; return 0
      fi
    done
    for p in $HEADERS; do
      f=$(ls "$root/tmp/debs/${p%%=*}_"*.deb) || { fail "ROCm $v: $p was not downloaded"; return 0; }
      dpkg-deb -x "$f" "$hdr" || { fail "ROCm $v: unpacking $p"; return 0; }
    done
    $SUDO rm -rf "$root/tmp/debs"
    in_root ldconfig
    echo "$stamp" | $SUDO tee "$root/.duet-stamp" >/dev/null
  fi
  echo "ROCm $v root ready in $((SECONDS - t0)) s ($(du -sh "$root" | cut -f1)); installed:"
  in_root dpkg-query -W -f '  ${Package} ${Version}\n' | grep -E 'hip|rocm|roc|comgr|hsa|rccl|llvm' || true
  [ -n "$ABSENT" ] && skip "ROCm $v: $ABSENT"

  $SUDO mkdir -p "$root/proc" "$root/opt/duet"
  $SUDO mount -t proc proc "$root/proc" && mounted+=("$root/proc")
  $SUDO cp "$TD/release/examples/rocm_check" "$TD/release/duet" "$root/opt/duet/"

  local ts=$SECONDS
  # 1. kernels: one process per target (ROCm 6.4's hiprtc aborts on a target it does not know).
  # A target's passing result is kept in $DUET_KERNEL_CHECK_CACHE (when set) under the hash of
  # what the compile reads: the kernel sources, the HIP backend's sources (options, launch
  # constants) and rocm_check's, the lock file, the pinned packages and the target. A hit
  # prints the stored lines again (marked "cached") instead of compiling.
  local arch out rc key hit
  for arch in $ARCHS; do
    key="" hit=""
    if [ -n "${DUET_KERNEL_CHECK_CACHE:-}" ]; then
      mkdir -p "$DUET_KERNEL_CHECK_CACHE"
      key=$(cd "$REPO" && { git ls-files -co --exclude-standard -z kernels-hip kernels-shared \
              crates/hip/src crates/hip/examples/rocm_check.rs crates/device/src crates/gpu/src \
              Cargo.lock | sort -z | xargs -0 sha256sum; echo "$v $INSTALL $EXTRACT $arch"; } |
            sha256sum | cut -c1-24)
      key="$DUET_KERNEL_CHECK_CACHE/rocm-$v-${arch%%:*}-$key.out"
      [ -f "$key" ] && hit=1
    fi
    if [ -n "$hit" ]; then
      out=$(cat "$key"); rc=0
      echo "[$v] cached: $arch kernels compiled with these sources before ($(basename "$key"))"
    else
      # AMD_COMGR_CACHE=0: comgr (ROCm 6.4+/7) keeps its own cache of compiles under ~/.cache.
      out=$(in_root env AMD_COMGR_CACHE=0 /opt/duet/rocm_check compile "$arch" 2>&1)
      rc=$?
    fi
    echo "$out" | sed "s/^/[$v] /"
    if [ -n "$key" ] && [ -z "$hit" ] && [ $rc -eq 0 ] && grep -q "^probe-ok $arch" <<<"$out" &&
       ! grep -q "^FAIL" <<<"$out"; then
      printf '%s\n' "$out" >"$key.tmp" && mv "$key.tmp" "$key"
    fi
    # Only a target this version is known not to have may be unknown (MAY_BE_UNKNOWN); for
    # duet's own targets an "unknown" compiler answer (or no answer: hiprtc not loading, the
    # chroot failing) is a failure.
    if [ $rc -eq 0 ] && grep -q "^probe-ok $arch" <<<"$out" && ! grep -q "^FAIL" <<<"$out"; then
      continue
    elif ! grep -q "^probe-ok $arch" <<<"$out"; then
      echo "[$v] UNKNOWN-TARGET $arch: hiprtc rejected or ended the process (exit $rc) compiling a trivial kernel"
      case " $MAY_BE_UNKNOWN " in
        *" $v:${arch%%:*} "*) ;;
        *) fail "ROCm $v: hiprtc does not compile for $arch (exit $rc)" ;;
      esac
    else
      fail "ROCm $v: kernels for $arch (exit $rc)"
    fi
  done

  echo "[$v] time: kernels $((SECONDS - ts)) s"; ts=$SECONDS
  # 2a. symbols, through duet's loader and tables.
  out=$(in_root /opt/duet/rocm_check symbols 2>&1); rc=$?
  echo "$out" | sed "s/^/[$v] /"
  [ $rc -eq 0 ] || fail "ROCm $v: symbols (exit $rc)"
  local lib
  for lib in $(grep '^SKIP' <<<"$out" | cut -d: -f1 | sed 's/^SKIP //'); do
    case "$ABSENT" in
      *"${lib#lib}"*) skip "ROCm $v: symbols not checked: $lib (known absent)" ;;
      *) fail "ROCm $v: $lib is missing from the root" ;;
    esac
  done
  # 2b. constants and layouts against the headers.
  in_root /opt/duet/rocm_check layout >"$CACHE/layout-$v.txt" || fail "ROCm $v: rocm_check layout (exit $?)"
  if python3 scripts/rocm/probe.py --include "$hdr/usr/include" --layout "$CACHE/layout-$v.txt" \
      --work "$CACHE/probe-$v" 2>&1 | sed "s/^/[$v] /"; [ "${PIPESTATUS[0]}" -ne 0 ]; then
    fail "ROCm $v: constants/layouts differ from the headers"
  fi

  echo "[$v] time: symbols + constants $((SECONDS - ts)) s"; ts=$SECONDS
  # 3. bindings from this version's headers.
  local bdiff="$CACHE/bindgen-$v.diff"
  ROCM_PATH="$hdr/usr" bash scripts/hip/bindgen.sh --check >"$bdiff" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "[$v] bindgen: committed bindings match the $v headers"
  elif [ $rc -ne 1 ]; then
    cat "$bdiff"; fail "ROCm $v: scripts/hip/bindgen.sh --check failed (exit $rc)"
  elif [ "$v" = 6.4 ]; then
    cat "$bdiff"; fail "ROCm $v: committed bindings differ from a regeneration (scripts/hip/bindgen.sh)"
  else
    echo "[$v] bindgen: the $v headers give different bindings (reported, not a failure):"
    grep -E '^[-+][^-+]' "$bdiff" | sed "s/^/[$v]   /" | head -60
  fi

  echo "[$v] time: bindgen $((SECONDS - ts)) s"; ts=$SECONDS
  # 4. the duet binary with the root's libraries and no GPU.
  local o
  o=$(in_root /opt/duet/duet info 2>&1); rc=$?
  echo "$o" | sed "s/^/[$v] duet info: /"
  if [ $rc -ge 101 ] || grep -qiE 'panicked|segmentation' <<<"$o" || ! grep -q '^hip: ' <<<"$o"; then
    fail "ROCm $v: duet info (exit $rc)"
  fi
  o=$(in_root /opt/duet/duet train --backend hip 2>&1); rc=$?
  echo "$o" | sed "s/^/[$v] duet train --backend hip: /"
  echo "[$v] duet train --backend hip: exit $rc"
  if [ $rc -eq 0 ] || [ $rc -ge 101 ] || grep -qiE 'panicked|segmentation' <<<"$o" \
      || ! grep -qi 'hip' <<<"$o"; then
    fail "ROCm $v: duet train --backend hip did not end with a clean error (exit $rc)"
  fi
  echo "[$v] time: duet info/train $((SECONDS - ts)) s"
  $SUDO umount -l "$root/proc"
}

for v in $VERSIONS; do
  t0=$SECONDS
  check_version "$v" || fail "ROCm $v: not a version this script knows (exit $?)"
  echo "=== ROCm $v took $((SECONDS - t0)) s"
done

echo "=== rocm-check summary"
for s in "${SKIPS[@]}"; do echo "SKIP: $s"; done
for f in "${FAILS[@]}"; do echo "FAIL: $f"; done
echo "rocm-check: ${#FAILS[@]} failures, ${#SKIPS[@]} skips"
[ ${#FAILS[@]} -eq 0 ]
