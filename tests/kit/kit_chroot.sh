#!/usr/bin/env bash
# The GPU kit needs nothing from the machine but glibc, libstdc++ and CUDA's own libraries.
# Proof: make the kit from BUILD_DIR (scripts/gpu-bundle --no-build), then run
# scripts/gpu-check --part cpu (unpack, every library resolves, the CPU tests, a 2-rank
# allreduce through the launcher and the kit's mpirun) with chroot in a minimal Debian root
# (debootstrap --variant=minbase: no Open MPI, hwloc, oneDNN, fmt, libjpeg, no -dev package).
# CUDA's own libraries are what the GPU machine provides: the host's are bound into the root
# where the kit looks for them (/usr/local/cuda/lib64); nothing else of the host is.
#
# The root is made once, with the mirror and suite of apt's own sources, and cached outside
# the checkout ($TNT_KIT_ROOT, else ${XDG_CACHE_HOME:-$HOME/.cache}/tarantella/kit-root):
# built in a temporary folder and renamed into place, so a broken run never leaves half a
# root. Mounts happen in a private mount namespace (unshare), so concurrent runs do not see
# each other's and nothing outlives the run. Every wait has a limit. Fails, never skips.
#   tests/kit/kit_chroot.sh BUILD_DIR
set -euo pipefail
me=kit_chroot
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: kit_chroot.sh BUILD_DIR}" && pwd)
cache=${TNT_KIT_ROOT:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tarantella/kit-root}
t_start=$SECONDS

fail() {
  echo "$me: FAIL: $*" >&2
  exit 1
}
phase() { echo "$me: [$((SECONDS - t_start))s] $*"; }

[[ $(id -u) -eq 0 ]] || fail "needs root (debootstrap, mount, chroot)"
for tool in debootstrap chroot unshare mount umount flock timeout tar python3; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed (scripts/setup installs debootstrap)"
done

work=""
tmp_root=""
run_dir=""
run_id=tnt-kit-$$-$RANDOM
cleanup() {
  local rc=$?
  # Anything of this run still alive inside the root (marked by TNT_KIT_RUN in its environment).
  local p
  for p in /proc/[0-9]*; do
    if grep -qsz "^TNT_KIT_RUN=$run_id\$" "$p/environ" 2>/dev/null; then kill -9 "${p#/proc/}" 2>/dev/null || true; fi
  done
  [[ -n "$run_dir" ]] && rm -rf --one-file-system "$run_dir"
  [[ -n "$tmp_root" ]] && rm -rf --one-file-system "$tmp_root"
  [[ -n "$work" ]] && rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the mirror and suite, from apt's sources ------------------------------------------------
read -r mirror suite keyring < <(python3 - <<'EOF'
import glob, os, re
codename = ""
try:
    for line in open("/etc/os-release"):
        if line.startswith("VERSION_CODENAME="):
            codename = line.split("=", 1)[1].strip().strip('"')
except OSError:
    pass
entries = []  # (uri, suite, keyring)
def add(types, uris, suites, comps, keyring):
    if "deb" not in types or "main" not in comps:
        return
    for u in uris:
        if re.match(r"https?://", u):
            for s in suites:
                entries.append((u, s, keyring))
files = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
for f in files:
    try:
        lines = open(f).read().splitlines()
    except OSError:
        continue
    for line in lines:
        line = line.split("#", 1)[0].strip()
        m = re.match(r"(deb)\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
        if m:
            opts = m.group(2) or ""
            k = re.search(r"signed-by=(\S+?)\]?(\s|$)", opts)
            add(["deb"], [m.group(3)], [m.group(4)], m.group(5).split(), k.group(1) if k else "")
for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    try:
        text = open(f).read()
    except OSError:
        continue
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        add(fields.get("types", "").split(), fields.get("uris", "").split(), fields.get("suites", "").split(),
            fields.get("components", "").split(), fields.get("signed-by", ""))
# The release itself: the machine's codename, else the first suite that is not an update pocket.
best = [e for e in entries if e[1] == codename] or [e for e in entries if not re.search(r"[-/]", e[1])]
if best:
    uri, s, k = best[0]
    print(uri, s, k if k.startswith("/") and os.path.isfile(k) else "-")
EOF
) || true
[[ -n "${mirror:-}" && -n "${suite:-}" ]] ||
  fail "no Debian mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d (a 'deb' entry with component main)"

# --- the minimal root, made once --------------------------------------------------------------
mkdir -p "$(dirname "$cache")"
stamp="suite=$suite mirror=$mirror variant=minbase"
root_ok() { [[ -f "$cache/.tnt-kit-root" && "$(head -n 1 "$cache/.tnt-kit-root")" == "$stamp" ]]; }
# Shared while the root is used; exclusive only to make it.
exec 9>"$cache.lock"
flock -s -w 1800 9 || fail "waited 30 minutes for $cache.lock (another run making the root?)"
if ! root_ok; then
  flock -u 9
  flock -x -w 1800 9 || fail "waited 30 minutes for $cache.lock (other runs using the root?)"
fi
if ! root_ok; then
  phase "making the minimal root: debootstrap --variant=minbase $suite $mirror (once; cached in $cache)"
  tmp_root=$(mktemp -d "$cache.new.XXXXXX")
  keyring_arg=()
  [[ "$keyring" != - ]] && keyring_arg=(--keyring="$keyring")
  # In a private mount namespace: whatever debootstrap mounts inside the root ends with it.
  if ! timeout -k 10 1500 unshare --mount --propagation private \
    debootstrap --variant=minbase "${keyring_arg[@]}" "$suite" "$tmp_root" "$mirror" >"$tmp_root.log" 2>&1; then
    tail -n 30 "$tmp_root.log" >&2
    rm -f "$tmp_root.log"
    fail "debootstrap --variant=minbase $suite $mirror failed (or ran past 25 minutes)"
  fi
  rm -f "$tmp_root.log"
  { echo "$stamp"; date -u +%Y-%m-%dT%H:%M:%SZ; } >"$tmp_root/.tnt-kit-root"
  if [[ -d "$cache" ]]; then
    mv -T "$cache" "$cache.old.$$"
    rm -rf --one-file-system "$cache.old.$$"
  fi
  mv -T "$tmp_root" "$cache"
  tmp_root=""
  phase "root made"
else
  phase "cached minimal root: $cache ($(sed -n 2p "$cache/.tnt-kit-root"))"
fi
# Others may use the root now, nobody may replace it while this run does.
flock -s -w 60 9 || fail "could not share $cache.lock"
R=$cache
# A root that holds what the kit must carry would prove nothing.
for f in usr/bin/orterun usr/bin/mpirun usr/lib/x86_64-linux-gnu/libmpi.so.40 usr/lib/x86_64-linux-gnu/libdnnl.so.2 \
  usr/lib/x86_64-linux-gnu/libhwloc.so.15 usr/lib/x86_64-linux-gnu/libfmt.so.9; do
  [[ ! -e "$R/$f" ]] || fail "the cached root $R holds /$f: it is not minimal; delete $R and run again"
done
if grep -qE '^Package: (.*-dev|openmpi-.*|libopenmpi.*|libdnnl.*|libhwloc.*|libfmt.*)$' "$R/var/lib/dpkg/status"; then
  fail "the cached root $R has -dev, Open MPI, oneDNN, hwloc or fmt packages: it is not minimal; delete it"
fi

# --- the kit -------------------------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/$me.XXXXXX")
phase "making the kit from $build"
timeout -k 10 900 "$src/scripts/gpu-bundle" --no-build --allow-cpu-only --build-dir "$build" \
  --out "$work/tnt-gpu-kit.tar.gz" >"$work/bundle.log" 2>&1 || {
  cat "$work/bundle.log" >&2
  fail "scripts/gpu-bundle could not make the kit"
}
sed 's/^/  /' "$work/bundle.log"
kit=$(tail -n 1 "$work/bundle.log")
[[ -f "$kit" ]] || fail "scripts/gpu-bundle printed no archive path"
tar -xzOf "$kit" tnt-gpu-kit/cuda-libs.txt >"$work/cuda-libs.txt" || fail "the kit has no cuda-libs.txt"

# CUDA's own libraries, from this machine (as the GPU machine has its own): the folder of
# each; the first one (the toolkit's) where gpu-check looks by default, the others passed on.
libtnt=$(find "$build" -maxdepth 2 -name 'libtarantella.so*' -type f | head -n 1)
cuda_dirs=()
while IFS= read -r soname; do
  [[ -n "$soname" && "$soname" != libcuda.so.1 ]] || continue
  path=$(ldd "$libtnt" | awk -v n="$soname" '$1 == n {print $3}')
  [[ -n "$path" && -f "$path" ]] || path=$(ldconfig -p | awk -v n="$soname" '$1 == n && /x86-64/ && !found {print $NF; found = 1}')
  [[ -n "$path" ]] || fail "the kit needs $soname from the machine, and this machine has none"
  d=$(dirname "$(readlink -f "$path")")
  case " ${cuda_dirs[*]} " in *" $d "*) ;; *) cuda_dirs+=("$d") ;; esac
done <"$work/cuda-libs.txt"

run_dir=$(mktemp -d "$R/tmp/tnt-kit.XXXXXX")
inner=/tmp/$(basename "$run_dir")
cp "$kit" "$run_dir/"
cp "$src/scripts/gpu-check" "$run_dir/gpu-check"

# --- the run, in the root ------------------------------------------------------------------------
cat >"$work/inside.sh" <<'EOF'
# Runs in a private mount namespace: mounts /proc, /sys, /dev/shm and CUDA's folders into the
# root, runs gpu-check there, unmounts (the namespace drops anything left when it ends).
set -uo pipefail
R=$1 inner=$2
shift 2
mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap unmount_all EXIT
trap 'exit 130' INT TERM
mount -t proc proc "$R/proc" && mounted+=("$R/proc") || exit 3
mount --rbind /sys "$R/sys" && mounted+=("$R/sys") || exit 3
mkdir -p "$R/dev/shm"
mount -t tmpfs -o size=512m tmpfs "$R/dev/shm" && mounted+=("$R/dev/shm") || exit 3
extra=""
i=0
for d in "$@"; do
  if ((i == 0)); then target=/usr/local/cuda/lib64; else target=/opt/tnt-host-cuda/$i; extra=$extra:$target; fi
  mkdir -p "$R$target"
  mount --bind "$d" "$R$target" && mounted+=("$R$target") || exit 3
  mount -o remount,bind,ro "$R$target" 2>/dev/null || true
  i=$((i + 1))
done
chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  TMPDIR=/tmp LANG=C.UTF-8 TNT_KIT_RUN="$TNT_KIT_RUN" ${extra:+LD_LIBRARY_PATH=${extra#:}} \
  bash "$inner/gpu-check" --part cpu --kit "$inner/$(basename "$KIT")" --out "$inner/out" --budget 600
EOF
phase "gpu-check --part cpu in the root (CUDA's libraries from: ${cuda_dirs[*]:-none needed})"
rc=0
TNT_KIT_RUN=$run_id KIT=$kit timeout -k 15 720 unshare --mount --propagation private \
  bash "$work/inside.sh" "$R" "$inner" "${cuda_dirs[@]}" >"$work/run.log" 2>&1 || rc=$?
cat "$work/run.log"
[[ -f "$run_dir/out/cpu.log" ]] && { echo "--- $me: gpu-check's log"; cat "$run_dir/out/cpu.log"; } >"$work/gpu-check.log"
if ((rc != 0)); then
  [[ -f "$work/gpu-check.log" ]] && tail -n 150 "$work/gpu-check.log"
  ((rc == 124 || rc == 137)) && fail "the run in the root took longer than 12 minutes"
  ((rc == 3)) && fail "could not mount /proc, /sys, /dev/shm or CUDA's folders in the root"
  fail "gpu-check --part cpu failed in the minimal root (exit $rc); its summary is above"
fi
summary=$run_dir/out/summary-cpu.txt
[[ -f "$summary" ]] || fail "gpu-check wrote no summary"
# Each promised step ran and passed.
for step in "libraries" "cuda libraries" "allreduce 2 ranks (cpu)" "launcher --version"; do
  grep -qE "^  PASS +[0-9]+s  $(sed 's/[()]/\\&/g' <<<"$step") " "$summary" || fail "step '$step' did not pass in the root"
done
n_cpu=$(grep -cE '^  PASS +[0-9]+s  test ' "$summary" || true)
((n_cpu >= 1)) || fail "no CPU test passed in the root"
phase "passed: the kit ran self-contained in the minimal root ($n_cpu CPU tests, 2-rank allreduce)"
