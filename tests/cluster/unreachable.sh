#!/usr/bin/env bash
# Hosts the launcher cannot reach are named before anything starts, or in one line when
# mpirun fails to start its daemon there, never as Open MPI's list of possible causes and
# "mpirun failed with exit code 255":
# - a host name that does not resolve (a hostfile line, an -H item): refused with exit 2,
#   naming the name and where it was listed. Name lookups here are limited to /etc/hosts
#   (a mount namespace with its own nsswitch.conf), so no name server is ever asked.
# - a host that resolves but refuses ssh (h2 of the test bed, on a port nothing listens
#   on): exit 1 and a line naming h2 and what ssh said.
# - with --skip-host-lookup the name is not looked up: the launch itself fails.
#
#   unreachable.sh LAUNCHER FASHION_MNIST
source "$(dirname "${BASH_SOURCE[0]}")/cluster_common.sh" "$@"
cl_up 2

small=(--model=mlp --num_train_samples=256 --batch_size=64 --train_epochs=1 --verbose=0 --model_dir="$cl_tmp/model")

# Lookups from /etc/hosts only: .invalid names are not there (and never are, RFC 2606).
printf 'hosts: files\n' >"$cl_tmp/nsswitch.conf"
cl_wrap=(unshare --mount sh -c 'mount --bind "$0" /etc/nsswitch.conf && exec "$@"' "$cl_tmp/nsswitch.conf")

printf 'h1 slots=1\nnosuchhost.invalid slots=1\n' >"$cl_tmp/hosts"
cl_run unknown_in_hostfile here 30 --hostfile "$cl_tmp/hosts" "${cl_launch[@]}" -- "${small[@]}"
cl_expect_exit unknown_in_hostfile 2
cl_expect_contains unknown_in_hostfile \
  "tarantella: error: hostfile '$cl_tmp/hosts', line 2: host 'nosuchhost.invalid' is not a known host name (" \
  "the unknown name and its hostfile line are named"
cl_expect_lacks unknown_in_hostfile "ORTE was unable" "no Open MPI account: nothing was started"
cl_expect_lacks unknown_in_hostfile "mpirun failed" "no 'mpirun failed'"

cl_run unknown_in_list here 30 -H h1,h2,typo.invalid:2 "${cl_launch[@]}" -- "${small[@]}"
cl_expect_exit unknown_in_list 2
cl_expect_contains unknown_in_list "tarantella: error: -H, item 3: host 'typo.invalid' is not a known host name (" \
  "the unknown name and its -H item are named"
# --skip-host-lookup: the name goes to the launch agent as it is (a name only it may know),
# and the job fails there instead, as a host that cannot be reached (exit 1).
cl_run unknown_skipped here 60 --skip-host-lookup -H h1,typo.invalid:1 "${cl_launch[@]}" -- "${small[@]}"
cl_expect_lacks unknown_skipped "is not a known host name" "no lookup before the launch"
if [[ $cl_rc -ne 0 && $cl_rc -ne 2 && $cl_rc -lt 124 ]]; then
  cl_pass "unknown_skipped: the launch fails there (exit status $cl_rc)"
else
  cl_fail "unknown_skipped: exit status $cl_rc, expected a failure to reach the host (1)"
fi
cl_wrap=()
cl_expect_no_processes 5 unknown

# h2 resolves (/etc/hosts) but nothing listens on port 1 there: ssh is refused at once.
cl_run refused h1 60 -H h1,h2 -x TNT_NUM_THREADS=1 --launch-agent "ssh -p 1 -o BatchMode=yes -o ConnectTimeout=5" \
  -- "${small[@]}"
cl_expect_exit refused 1
cl_expect_contains refused "tarantella: host h2 could not be reached, so mpirun could not start its daemon there: ssh: connect to host h2 port 1: Connection refused" \
  "h2 and ssh's reason in one line"
cl_expect_lacks refused "ORTE was unable to reliably start one or more daemons" "Open MPI's list of possible causes is not shown"
cl_expect_lacks refused "mpirun failed with exit code" "no 'mpirun failed with exit code'"
cl_expect_no_processes 5 refused
cl_finish
