# Sourced by scripts/setup and scripts/fuzz: runs a build with its output in a log and shows
# progress instead: on a terminal one line that updates in place, elsewhere (CI, a pipe) a
# line at each tenth done and at least once a minute, so no long build is silent and no
# no-change build floods the screen. On failure the compiler's errors and the log's tail.
# Safe under `set -euo pipefail` (the callers' mode): no command here may fail the caller.
#   tnt_build_with_progress TITLE LOG COMMAND...
tnt_build_with_progress() {
  local title=$1 log=$2
  shift 2
  local start=$SECONDS tty=0 status=0
  [[ -t 1 ]] && tty=1
  mkdir -p "$(dirname "$log")"
  : >"$log"
  # The build writes the log; the loop below follows it until the build has ended.
  "$@" >"$log" 2>&1 &
  local pid=$!
  local shown=-1 last_line=$SECONDS pct=0 what="" line
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    line=$(grep -aE '^\[ *[0-9]+%\] (Building|Linking|Generating)' "$log" | tail -1 || true)
    [[ -z "$line" ]] && continue
    pct=$(sed -E 's/^\[ *([0-9]+)%\].*/\1/' <<<"$line" || true)
    what=$(sed -E 's/^\[ *[0-9]+%\] //; s/^(Building|Linking) [A-Z+]+ (object|shared library|executable|static library) //' <<<"$line")
    if ((tty)); then
      printf '\r\033[K%s: %3d%% [%ds] %s' "$title" "$pct" $((SECONDS - start)) "${what:0:60}"
    elif ((pct / 10 != shown / 10 || SECONDS - last_line >= 60)); then
      echo "$title: $pct% after $((SECONDS - start)) s ($what)"
      shown=$pct
      last_line=$SECONDS
    fi
  done
  wait "$pid" || status=$?
  ((tty)) && printf '\r\033[K'
  if ((status != 0)); then
    echo "$title: FAILED after $((SECONDS - start)) s (exit $status); the errors (whole log: $log):" >&2
    grep -aE -A3 '(error|Error [0-9]+|undefined reference|fatal)' "$log" | awk '!seen[$0]++' | head -60 >&2 || true
    echo "--- the log's last lines:" >&2
    tail -15 "$log" >&2
    return "$status"
  fi
  if grep -qaE '^\[ *[0-9]+%\] (Building|Linking)' "$log"; then
    echo "$title: done in $((SECONDS - start)) s"
  else
    echo "$title: up to date"
  fi
}
