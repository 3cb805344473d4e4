#!/usr/bin/env bash
# Every tool that the scripts and tests call comes from scripts/setup on a fresh Debian 12.
#
# The tools are the ones the scripts and tests check for themselves before use (`command -v
# TOOL`, `for tool in A B C`), plus the build's own (cmake, ctest, the compilers, mpirun,
# ccache, protoc). A fresh Debian is modelled as its required packages (what debootstrap's
# minbase root holds) plus the dependency closure of setup's packages (apt-cache depends
# --recurse, Depends and Pre-Depends only: apt-get install --no-install-recommends); each
# tool is resolved here and the package that owns its file must be in that set. A tool that
# this machine happens to have from elsewhere (clang was one) fails the test.
#   tests/tools/test_setup_tools.sh SOURCE_DIR
set -euo pipefail
src=$(cd "${1:?usage: test_setup_tools.sh SOURCE_DIR}" && pwd)
me=setup_tools
fail() {
  echo "$me: FAIL: $*" >&2
  exit 1
}
for t in apt-cache dpkg-query dpkg; do command -v $t >/dev/null || fail "$t is not installed (a Debian machine has it)"; done

# Tools the GPU machine or CUDA provides, not Debian: never installed by setup.
not_debian=" nvidia-smi cuobjdump compute-sanitizer "
# Installed by setup only for the benchmarks (TNT_SETUP_BENCH=1), which check for them.
bench_only=" hyperfine "
# Only what Debian's packages put on a fresh machine's PATH: not /usr/local, not a
# per-user Python or toolchain of this machine.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

tools=(cmake ctest c++ cc make mpirun ccache protoc pkg-config python3)
mapfile -t files < <(cd "$src" && git ls-files scripts tests | grep -E '\.(sh|cmake|cpp)$|^scripts/[^.]*$' |
                       grep -v '^tests/tools/test_setup_tools.sh$')
((${#files[@]} > 10)) || fail "found only ${#files[@]} scripts and tests under $src"
while read -r word; do
  tools+=("$word")
done < <(cd "$src" && grep -hoE 'command -v [A-Za-z0-9+._-]+|for tool in [A-Za-z0-9+._ -]+' "${files[@]}" |
           sed -E 's/^command -v //; s/^for tool in //' | tr ' ' '\n' | grep -E '^[A-Za-z0-9+._-]+$' | sort -u)

# The fresh machine's packages: required ones, then setup's with their dependency closure.
mapfile -t wanted < <("$src/scripts/setup" --print-packages)
((${#wanted[@]} > 10)) || fail "scripts/setup --print-packages printed ${#wanted[@]} packages"
declare -A fresh=()
while read -r pkg prio; do
  [[ "$prio" == required ]] && fresh[$pkg]=1
done < <(dpkg-query -W -f='${Package} ${Priority}\n')
while read -r pkg; do
  pkg=${pkg#<}
  pkg=${pkg%>}
  pkg=${pkg%%:*}
  fresh[$pkg]=1
done < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
           --no-enhances "${wanted[@]}" 2>/dev/null | sed -nE 's/^([^ ].*)$/\1/p; s/^ +\|?(Pre)?Depends: //p')
for p in "${wanted[@]}"; do
  [[ -n "${fresh[$p]:-}" ]] || fail "apt-cache knows no package $p of scripts/setup's list (apt-get update?)"
done

# The package that owns a tool's file, following symlinks (alternatives) until one is owned.
owner() {
  local path=$1 pkg hops=0
  while ((hops < 8)); do
    if pkg=$(dpkg -S "$path" 2>/dev/null | head -1); then
      echo "${pkg%%:*}" | sed -E 's/,.*//; s/:[a-z0-9]+$//'
      return 0
    fi
    # /usr/bin and /bin (and the sbin pair) are one folder on a merged-/usr Debian; dpkg
    # knows one of the names.
    if [[ "$path" == /usr/*bin/* ]] && pkg=$(dpkg -S "${path#/usr}" 2>/dev/null | head -1); then
      echo "${pkg%%:*}"
      return 0
    fi
    [[ -L "$path" ]] || return 1
    path=$(readlink -f "$path")
    hops=$((hops + 1))
  done
  return 1
}

problems=0
checked=0
for tool in $(printf '%s\n' "${tools[@]}" | sort -u); do
  [[ "$not_debian" == *" $tool "* ]] && continue
  [[ "$bench_only" == *" $tool "* ]] && ! command -v "$tool" >/dev/null 2>&1 && continue
  path=$(command -v "$tool" 2>/dev/null) || { echo "$me: $tool: not installed here, though the scripts call it"; problems=$((problems + 1)); continue; }
  pkg=$(owner "$path") || { echo "$me: $tool ($path): no Debian package owns it"; problems=$((problems + 1)); continue; }
  checked=$((checked + 1))
  if [[ -z "${fresh[$pkg]:-}" ]]; then
    echo "$me: $tool ($path, package $pkg): not installed by scripts/setup on a fresh Debian; add $pkg (or the package that brings it) to setup's list"
    problems=$((problems + 1))
  fi
done
((checked >= 20)) || fail "only $checked tools checked: the scan of the scripts found too little"
((problems == 0)) || fail "$problems tool(s) the scripts call would be missing on a fresh Debian"
echo "$me: ok: $checked tools, each from a package that scripts/setup installs or a fresh Debian has"
