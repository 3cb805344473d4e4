#!/usr/bin/env bash
# Parameter-server training across hosts: the server on h2 (--ps-hosts), workers on h1 and
# h3, over TCP.
#   spread: trains and evaluates, exit 0; the dry run places the server on h2.
#   worker_lost: the worker on h3 SIGKILLed in the middle of the second epoch: the job goes
#     on without it (--heartbeat-timeout 3) and ends with exit 0, naming it dropped.
#   worker_stopped: the worker on h3 stopped (SIGSTOP) in the middle of the second epoch: the
#     server drops it after --heartbeat-timeout 2 (it cannot end a process on another host),
#     its step on h3 ends the stopped program once it has been stopped for twice that, and
#     the job ends with exit 0, naming it dropped, nothing left on h3.
#   server_lost: the server on h2 killed (SIGTERM: SIGKILL's status 137 reads as a hang to
#     cl_run) in the middle of training: the job ends within 10 s with the server named
#     (rank 1, host h2) and the server's status.
# Nothing of any job may be left on a host.
#
#   parameter_server.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
cl_up 3

roles=(-H h1,h2,h3 -n 1 --parameter-servers 1 --ps-hosts h2)
ps=(--model=mlp --batch_size=64 --verbose=0 --strategy=parameter_server)

cl_run plan h1 30 --dry-run "${roles[@]}" "${cl_launch[@]}" -- "${ps[@]}"
cl_expect_exit plan 0
cl_expect_contains plan "1 parameter server: rank 1 (host h2)" "the server on h2"

cl_run spread h1 90 "${roles[@]}" "${cl_launch[@]}" -- "${ps[@]}" --num_train_samples=2048 --train_epochs=2 \
  --model_dir="$cl_tmp/spread"
cl_expect_exit spread 0
cl_expect_contains spread "test accuracy:" "the test evaluation after the fit"

# lose_worker NAME SIGNAL HEARTBEAT: a job whose worker on h3 gets SIGNAL once the first
# epoch's row is written and 0.8 s more have passed (the workers then step in the second
# epoch, about 2 s each); the job's output is NAME's.
lose_worker() {
  local name=$1 signal=$2 heartbeat=$3
  (
    for _ in $(seq 1 400); do
      [[ -e $cl_tmp/$name/history.csv ]] && break
      sleep 0.1
    done
    sleep 0.8
    for p in $(cl_programs_on h3); do kill "-$signal" "$p"; done
  ) &
  local sender=$!
  cl_run "$name" h1 120 "${roles[@]}" --heartbeat-timeout "$heartbeat" -x TNT_COLLECTIVE_TIMEOUT=30 "${cl_launch[@]}" -- \
    "${ps[@]}" --num_train_samples=8192 --train_epochs=3 --model_dir="$cl_tmp/$name"
  wait "$sender"
  cl_expect_exit "$name" 0
  cl_expect_contains "$name" "rank 2 (worker, host h3, local rank 0): signal 9 (SIGKILL): dropped" "the account of each rank"
  cl_expect_contains "$name" "test accuracy:" "the test evaluation after the fit"
}

lose_worker worker_lost KILL 3
cl_expect_contains worker_lost "tarantella: worker rank 2 (host h3, local rank 0) ended: signal 9 (SIGKILL); parameter-server training goes on without it" "the lost worker named"

# The same with the worker stopped instead of killed.
lose_worker worker_stopped STOP 2
cl_expect_contains worker_stopped "rank 2 on h3: its program has been stopped" "the step on h3 ends the stopped worker"
[[ -z $(cl_programs_on h3) ]] && cl_pass "worker_stopped: nothing left on h3" || cl_fail "worker_stopped: a program left on h3"

(
  if cl_wait_for_programs h2 40 1; then
    for _ in $(seq 1 400); do
      [[ -e $cl_tmp/sl/history.csv ]] && break
      sleep 0.1
    done
    sleep 0.5
    date +%s.%N >"$cl_tmp/killed_at"
    for p in $(cl_programs_on h2); do kill -TERM "$p"; done
  fi
) &
killer=$!
cl_run server_lost h1 90 "${roles[@]}" "${cl_launch[@]}" -- "${ps[@]}" --num_train_samples=8192 --train_epochs=20 \
  --model_dir="$cl_tmp/sl"
wait "$killer"
[[ -f $cl_tmp/killed_at ]] || cl_abort "server_lost: the server never trained"
after=$(awk -v a="$(cat "$cl_tmp/killed_at")" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if awk -v t="$after" 'BEGIN { exit !(t < 10) }'; then
  cl_pass "server_lost: the job ended ${after}s after the server was killed"
else
  cl_fail "server_lost: the job ended ${after}s after the server was killed (limit 10 s)"
fi
cl_expect_exit server_lost 143
cl_expect_contains server_lost "tarantella: rank 1 (parameter server, host h2, local rank 0) failed first: signal 15 (SIGTERM)" "the server named"

cl_expect_no_processes 10 parameter_server
cl_finish
