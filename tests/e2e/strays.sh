# Ranks left running by an end-to-end test (sourced, not run). A test names its private temp
# dir on every command line it starts (the launcher's and so each rank's), so a process
# whose command line still names that dir after the launcher returned was left behind by
# the job: a rank, an orted, or the launcher itself after a timeout.
#
#   e2e_strays DIR         the pids of such processes, if any
#   e2e_no_strays DIR      0 when none is left; else lists them, kills them (so the next
#                          run starts clean) and returns 1
e2e_strays() { pgrep -f -- "$1" || true; }

e2e_no_strays() {
  # mpirun reaps its ranks just before it exits; give a loaded machine 5 s for that.
  local pids="" _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(e2e_strays "$1")
    [[ -z $pids ]] && return 0
    sleep 0.5
  done
  echo "processes still running after the launcher returned:"
  ps -o pid,ppid,etime,args -p "$(echo $pids | tr ' ' ,)" || true
  kill -9 $pids 2>/dev/null
  return 1
}
