#!/usr/bin/env bash
# Training across hosts over TCP gives the weights of the same ranks on one host: 2 hosts
# and 3 hosts with one rank each (the latter over a rate-limited network), and 2 ranks on
# one host + 1 on another, reached through a hostfile in both of its forms, -H, and from
# outside every host; the --dry-run plan table with remote hosts; launched on the second
# host, the ranks are where the plan puts them.
#
#   multi_host.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
cl_up 3

small=(--model=mlp --num_train_samples=512 --batch_size=64 --train_epochs=1 --verbose=0)

# The references: the same ranks on one host (h1, all of them local).
cl_run one_host_2 h1 60 -H h1:2 "${cl_launch[@]}" -- "${small[@]}" --model_dir="$cl_tmp/one2"
cl_expect_exit one_host_2 0
cl_run one_host_3 h1 60 -H h1:3 "${cl_launch[@]}" -- "${small[@]}" --model_dir="$cl_tmp/one3"
cl_expect_exit one_host_3 0

# 2 hosts, 1 rank each, from a hostfile in Open MPI's form, launched on the first host.
printf 'h1 slots=1\nh2 slots=1   # the second host\n' >"$cl_tmp/slots-form"
cl_run two_hosts h1 60 --hostfile "$cl_tmp/slots-form" "${cl_launch[@]}" -- "${small[@]}" --model_dir="$cl_tmp/two"
cl_expect_exit two_hosts 0
cl_same_weights two_hosts "$cl_tmp/one2" "$cl_tmp/two"

# 3 hosts, 1 rank each, with -H, launched from this machine's own namespace: every host is
# remote, and the ranks reach the launcher on the bridge's address (its host name resolves
# to one they cannot route to). The network is rate-limited (1 Gbit/s, tc tbf) for it.
"$cl_testbed" rate 1gbit || cl_fail "three_hosts: cannot rate-limit the test bed's links"
cl_run three_hosts here 60 -H h1,h2,h3 -n 1 "${cl_launch[@]}" -- "${small[@]}" --model_dir="$cl_tmp/three"
cl_expect_exit three_hosts 0
cl_same_weights three_hosts "$cl_tmp/one3" "$cl_tmp/three"
cl_expect_lacks three_hosts "cannot reach the launcher" "every rank reached the launcher"
"$cl_testbed" rate off

# 2 ranks on h1 and 1 on h2, from a hostfile in the host:N form.
printf '# two ranks here, one there\nh1:2\nh2:1\n' >"$cl_tmp/colon-form"
cl_run two_plus_one h1 60 --hostfile "$cl_tmp/colon-form" "${cl_launch[@]}" -- "${small[@]}" \
  --model_dir="$cl_tmp/two_plus_one"
cl_expect_exit two_plus_one 0
cl_same_weights two_plus_one "$cl_tmp/one3" "$cl_tmp/two_plus_one"

# The plan table names the remote hosts and their ranks.
cl_run plan h1 30 --dry-run --hostfile "$cl_tmp/colon-form" "${cl_launch[@]}" -- "${small[@]}"
cl_expect_exit plan 0
cl_expect_contains plan "3 ranks on 2 hosts (hosts from hostfile '$cl_tmp/colon-form')" "the plan's header"
if grep -Eq '^ +2 +h2 +0 +cpu' <<<"$cl_out" && grep -Eq '^ +1 +h1 +1 +cpu' <<<"$cl_out"; then
  cl_pass "plan: rank 1 is h1's local rank 1, rank 2 is h2's local rank 0"
else
  cl_fail "plan: the table does not place ranks 1 and 2 on h1 and h2"
fi
cl_expect_contains plan "--mca plm_rsh_agent $cl_agent" "the launch agent reaches mpirun"
cl_expect_contains plan "--host h1,h1,h2 -np 3 --map-by seq" "each rank's host, in order"

# Launched on a host that is not the first: rank 0, the master, is still on the first host
# (Open MPI by itself maps its own node first, which put rank 0 on h2 here).
real_program=$cl_program
cl_program=$(dirname "$cl_launcher")/tnt_rank_info
cl_run from_second h2 30 --hostfile "$cl_tmp/colon-form" "${cl_launch[@]}" --
cl_program=$real_program
cl_expect_exit from_second 0
if grep -Eq '^ +0 +3 +0 +h1 ' <<<"$cl_out" && grep -Eq '^ +1 +3 +1 +h1 ' <<<"$cl_out" &&
  grep -Eq '^ +2 +3 +0 +h2 ' <<<"$cl_out"; then
  cl_pass "from_second: ranks 0 and 1 on h1, rank 2 on h2, as planned"
else
  cl_fail "from_second: the ranks are not on the planned hosts (rank 0 must be on h1)"
fi

cl_expect_no_processes 10 multi_host
cl_finish
