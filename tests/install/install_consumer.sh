#!/usr/bin/env bash
# libtarantella as a library people build on: install the build into a temporary prefix,
# build tests/install/consumer/prog.cpp outside the tree twice (a CMake project with
# find_package(tarantella), and plain g++ with pkg-config), and run each on 2 ranks with the
# INSTALLED launcher, with LD_LIBRARY_PATH unset (the RPATHs must do). Every step that
# fails makes the test fail; nothing is skipped.
#
#   install_consumer.sh BUILD_DIR CONSUMER_SRC LIBDIR CMAKE CXX PKG_CONFIG
#
# Checks: the installed files are there; no installed header includes a dependency's header
# (anything but the standard library, fmt and tarantella itself); both programs link the
# prefix's libtarantella; on 2 ranks each rank prints a correct allreduce and the same loss
# as the 1-process run of the CMake-built program (a one-step-per-epoch fit: epoch 2's loss
# depends on the allreduced gradient).
set -uo pipefail
[[ $# -eq 6 ]] || { echo "usage: $0 BUILD_DIR CONSUMER_SRC LIBDIR CMAKE CXX PKG_CONFIG" >&2; exit 2; }
build_dir=$1
consumer_src=$2
libdir=$3
cmake=$4
cxx=$5
pkg_config=$6
# Each step gets its own bound; together they stay well inside CTest's TIMEOUT. A compile
# of prog.cpp takes about 2 s, a 2-rank run under 1 s on an idle 2-core machine.
limit=${TNT_INSTALL_TEST_TIMEOUT:-120}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tnt_install_test.XXXXXX")
prefix=$tmp/prefix
cleanup() {
  # Only processes of this test's own runs carry its temp dir in their command line.
  local pids
  pids=$(pgrep -f -- "$tmp" || true)
  [[ -n "$pids" ]] && kill -9 $pids 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
unset LD_LIBRARY_PATH

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
# step NAME COMMAND...: runs with a time limit, shows its output, and ends the test when it
# fails (what follows depends on it).
step() {
  local name=$1
  shift
  echo "+ $*"
  timeout -k 5 "$limit" "$@" >"$tmp/step.out" 2>&1
  local rc=$?
  cat "$tmp/step.out"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "FAIL: $name: did not finish within ${limit}s"
    exit 1
  elif [[ $rc -ne 0 ]]; then
    echo "FAIL: $name: exit status $rc"
    exit 1
  fi
  pass "$name"
}

# --- install ------------------------------------------------------------------------------
step "cmake --install into a temporary prefix" "$cmake" --install "$build_dir" --prefix "$prefix"
for f in bin/tarantella bin/tnt_rank_info "$libdir/libtarantella.so" include/tarantella/tarantella.hpp \
         "$libdir/libtarantella_text.so" include/tarantella/text/subtokenizer.hpp include/tarantella/text/bleu.hpp \
         include/tarantella/build_config.hpp "$libdir/cmake/tarantella/tarantellaConfig.cmake" \
         "$libdir/cmake/tarantella/tarantellaConfigVersion.cmake" "$libdir/cmake/tarantella/tarantellaTargets.cmake" \
         "$libdir/pkgconfig/tarantella.pc"; do
  if [[ -f $prefix/$f ]]; then pass "installed $f"; else fail "$f not installed"; fi
done

# Public headers include the standard library, fmt and tarantella only: no MPI, CUDA, oneDNN
# or other dependency headers (a consumer has only fmt). A standard header has no '.' or '/'.
bad=$(grep -rhE '^[[:space:]]*#[[:space:]]*include' "$prefix/include/tarantella" |
      grep -vE '#[[:space:]]*include[[:space:]]*(<[a-z_0-9]+>|<fmt/[^>]+>|[<"]tarantella/[^">]+[">])' || true)
if [[ -z "$bad" ]]; then pass "installed headers include no dependency headers but fmt"; else fail "dependency headers in the public headers:"; echo "$bad"; fi

# --- a consumer project outside the tree ------------------------------------------------------
cp -r "$consumer_src" "$tmp/src"
step "configure the consumer (find_package(tarantella))" "$cmake" -S "$tmp/src" -B "$tmp/cmake-build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
found_dir=$(sed -n 's/^tarantella_DIR:PATH=//p' "$tmp/cmake-build/CMakeCache.txt")
if [[ $found_dir == "$prefix/$libdir/cmake/tarantella" ]]; then pass "found the installed package"; else fail "tarantella_DIR is '$found_dir', not the prefix's"; fi
step "build the consumer with CMake" "$cmake" --build "$tmp/cmake-build"
# tarantella::text is its own target; the core library carries none of it.
run_text=$(timeout -k 5 "$limit" "$tmp/cmake-build/text_prog" 2>&1)
if [[ $? -eq 0 ]]; then pass "text_prog (tarantella::text): $run_text"; else fail "text_prog (tarantella::text): $run_text"; fi
if nm -D --defined-only "$prefix/$libdir/libtarantella.so" | grep -q 'Subtokenizer'; then
  fail "libtarantella.so still defines the Subtokenizer"
else
  pass "libtarantella.so carries no text processing"
fi

# The SONAME carries the version (major.minor before 1.0): a program built against this
# version asks for it, and another version's library does not load in its place.
version=$(sed -n 's/^#define TNT_VERSION "\(.*\)"$/\1/p' "$prefix/include/tarantella/build_config.hpp")
if [[ $version == 0.* ]]; then want_so=$(cut -d. -f1,2 <<<"$version"); else want_so=${version%%.*}; fi
for lib in libtarantella libtarantella_text; do
  soname=$(objdump -p "$prefix/$libdir/$lib.so" | awk '$1 == "SONAME" { print $2 }')
  if [[ $soname == "$lib.so.$want_so" ]]; then pass "$lib.so's SONAME is $soname (version $version)"; else fail "$lib.so's SONAME is '$soname', not $lib.so.$want_so"; fi
done
soname=libtarantella.so.$want_so

export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
flags=$(timeout 10 "$pkg_config" --cflags --libs tarantella) || { echo "FAIL: pkg-config --cflags --libs tarantella"; exit 1; }
echo "pkg-config --cflags --libs tarantella: $flags"
# shellcheck disable=SC2086 # the flags are words
step "build the consumer with g++ and pkg-config" "$cxx" -std=c++20 "$tmp/src/prog.cpp" $flags -o "$tmp/prog_pc"

for prog in "$tmp/cmake-build/prog" "$tmp/prog_pc"; do
  lib=$(ldd "$prog" | awk -v n="$soname" '$1 == n { print $3 }')
  # The .pc's paths go through its own folder (lib/pkgconfig/../..): compared resolved.
  if [[ -n $lib && $(readlink -f "$lib") == $(readlink -f "$prefix/$libdir/libtarantella.so") ]]; then
    pass "${prog#"$tmp"/} loads $lib"
  else
    fail "${prog#"$tmp"/} loads $soname from '$lib'"
  fi
  if ldd "$prog" | grep -q 'not found'; then fail "${prog#"$tmp"/}: libraries not found:"; ldd "$prog" | grep 'not found'; fi
done

# The .pc finds its prefix from its own place: a copy elsewhere, with a space in its path
# (before: the install's absolute prefix, written as it was, so the copy's headers were not
# found, and a space split the flags).
moved="$tmp/moved prefix"
cp -a "$prefix" "$moved"
flags_moved=$(PKG_CONFIG_PATH="$moved/$libdir/pkgconfig" timeout 10 "$pkg_config" --cflags --libs tarantella)
echo "pkg-config for the moved prefix: $flags_moved"
if [[ $flags_moved == *"moved\\ prefix/"* && $flags_moved != *"$prefix/"* ]]; then
  pass "pkg-config gives the moved prefix's paths"
else
  fail "pkg-config for a moved prefix: $flags_moved"
fi
step "compile the consumer against the moved prefix (pkg-config)" \
  bash -c "eval \"\$0 -std=c++20 -fsyntax-only \$1 \$2\"" "$cxx" "$tmp/src/prog.cpp" "$flags_moved"
rm -rf "$moved"

# A consumer compiling in C++17 (g++ 12's default) is told what is wrong first.
printf '#include <tarantella/tarantella.hpp>\nint main() { return 0; }\n' >"$tmp/cxx17.cpp"
# shellcheck disable=SC2086 # the flags are words
"$cxx" -std=c++17 -fsyntax-only "$tmp/cxx17.cpp" $flags >"$tmp/cxx17.out" 2>&1
first=$(grep -m 1 'error' "$tmp/cxx17.out")
if [[ $first == *"tarantella needs C++20"* ]]; then pass "C++17: $first"; else fail "C++17 consumer, first error: '$first'"; fi

# --- run ------------------------------------------------------------------------------------
# run NAME COMMAND...: output in $out; a failure or a hang counts, the test goes on.
run() {
  local name=$1
  shift
  echo "+ $*"
  timeout -k 5 "$limit" "$@" </dev/null >"$tmp/run.out" 2>&1
  local rc=$?
  out=$(cat "$tmp/run.out")
  echo "$out"
  if [[ $rc -eq 0 ]]; then pass "$name: exit status 0"; else fail "$name: exit status $rc"; fi
}
loss_of() { sed -n "s/^fit rank $1 of $2: loss //p" <<<"$out"; }

run "1 process" "$tmp/cmake-build/prog"
serial=$(loss_of 0 1)
if grep -qx 'allreduce rank 0 of 1: ok' <<<"$out" && [[ -n $serial ]]; then pass "1 process: allreduce ok, loss $serial"; else fail "1 process: no 'allreduce ... ok' and 'fit ... loss' lines"; fi

for prog in "$tmp/cmake-build/prog" "$tmp/prog_pc"; do
  name="${prog#"$tmp"/} on 2 ranks"
  run "$name" "$prefix/bin/tarantella" -n 2 -x TNT_NUM_THREADS=1 -- "$prog"
  for r in 0 1; do
    if grep -qx "allreduce rank $r of 2: ok" <<<"$out"; then pass "$name: rank $r allreduce"; else fail "$name: no 'allreduce rank $r of 2: ok'"; fi
    loss=$(loss_of $r 2)
    # f32 sums in another order (two micro-batches of 4 instead of one of 8): a few ulps.
    if [[ -n $loss && -n $serial ]] && awk -v a="$loss" -v b="$serial" 'BEGIN {
         split(a, x, " "); split(b, y, " ")
         for (i = 1; i <= 2; i++) { d = x[i] - y[i]; if (d < 0) d = -d; m = y[i] < 0 ? -y[i] : y[i]
                                    if (x[i] == "" || d > 1e-5 * m + 1e-7) exit 1 }
       }'; then
      pass "$name: rank $r loss $loss matches 1 process"
    else
      fail "$name: rank $r loss '$loss', 1 process '$serial'"
    fi
  done
done

# --- the example project of docs/coming-from.md ---------------------------------------------
# A custom layer with a CPU and a CUDA engine (the CUDA one compiles when the installed
# library has CUDA), a custom loss and metric, trained on 2 ranks; its checkpoint is read by
# the example's 40-line Python reader into PyTorch with strict=True, whose predictions must
# match the ones the program wrote.
example_src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../examples/custom_layer" && pwd)
cp -r "$example_src" "$tmp/example"
step "configure examples/custom_layer" "$cmake" -S "$tmp/example" -B "$tmp/example-build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
step "build examples/custom_layer" "$cmake" --build "$tmp/example-build"
if grep -q 'TNT_WITH_CUDA_BUILD 1' "$prefix/include/tarantella/build_config.hpp"; then
  if [[ -n $(find "$tmp/example-build" -name 'scaled_tanh_cuda.cu.o') ]]; then pass "the example's CUDA engine compiled"; else fail "the library has CUDA but the example's CUDA engine was not built"; fi
fi
# The output directory does not exist yet: the example makes it (as docs/coming-from.md runs it).
run "examples/custom_layer on 2 ranks" "$prefix/bin/tarantella" -n 2 -x TNT_NUM_THREADS=1 -- \
  "$tmp/example-build/custom_layer" "$tmp/example-out"
if grep -q '^ranks 2: final loss' <<<"$out"; then pass "example: trained on 2 ranks"; else fail "example: no 'ranks 2: final loss' line"; fi
python=$(PATH=/usr/bin:$PATH command -v python3)
run "read_checkpoint.py loads the example's checkpoint into PyTorch" "$python" "$tmp/example/read_checkpoint.py" "$tmp/example-out"

if [[ $failures -gt 0 ]]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
