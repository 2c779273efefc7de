#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for the tests of `--launcher slurm` (tests/test_slurm_launcher.py) and CI:
# munged, MariaDB + slurmdbd (so that `sacct` has the jobs' accounting), slurmctld and slurmd. A job runs at the
# priority (nice value) of the command that submitted it (PropagatePrioProcess=1): the test suite's jobs share the
# machine as the suite does, and `nice make test` makes them nice too. No cgroups (proctrack/linuxproc, task/none),
# no GPUs, this host's CPUs.
#
#   tests/slurm/start_local_slurm.sh [--install] [STATE_DIR]
#
# --install: apt-get install the Debian packages first where they are missing (needs root). STATE_DIR (default
# /var/tmp/graft-slurm) holds slurm.conf, slurmdbd.conf, the spool, state and logs; nothing under /etc/slurm is
# written, so a host's own Slurm configuration is never touched. Idempotent: daemons already up are kept, unless
# slurm.conf changed, when slurmctld and slurmd are restarted with the new one.
# The last line printed is `SLURM_CONF=<STATE_DIR>/etc/slurm.conf`: export it for sbatch/squeue/sacct.
# Exit status 0: the cluster answers and its node is idle; 2: it cannot be installed or started (the reason on
# stderr, one line).
set -uo pipefail

INSTALL=0
if [ "${1:-}" = "--install" ]; then INSTALL=1; shift; fi
STATE=${1:-/var/tmp/graft-slurm}
ETC=$STATE/etc
CLUSTER=graftlocal
export SLURM_CONF=$ETC/slurm.conf

fail() { echo "start_local_slurm: $*" >&2; exit 2; }
waitfor() {  # waitfor SECONDS CMD...: poll CMD every 0.5 s until it succeeds
  local until=$((SECONDS + $1)); shift
  while ! "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $until ] && return 1
    sleep 0.5
  done
}

PKGS="slurmctld slurmd slurmdbd slurm-client munge mariadb-server"
have_all() { for b in slurmctld slurmd slurmdbd sbatch munged mariadbd; do command -v $b >/dev/null || return 1; done; }
if ! have_all; then
  [ $INSTALL = 1 ] || fail "Slurm is not installed (need: $PKGS; rerun with --install as root)"
  [ "$(id -u)" = 0 ] || fail "installing Slurm needs root"
  command -v apt-get >/dev/null || fail "no apt-get: install $PKGS by hand"
  export DEBIAN_FRONTEND=noninteractive
  nice -n 19 apt-get update -q >"$STATE.apt.log" 2>&1 || fail "apt-get update failed (log: $STATE.apt.log)"
  nice -n 19 apt-get install -y -q --no-install-recommends $PKGS >>"$STATE.apt.log" 2>&1 \
    || fail "apt-get install $PKGS failed (log: $STATE.apt.log)"
  have_all || fail "the packages installed but a daemon is missing"
fi
[ "$(id -u)" = 0 ] || fail "the daemons are started as root (SlurmUser=root)"

mkdir -p "$ETC" "$STATE/spool/ctld" "$STATE/spool/d" "$STATE/log" "$STATE/run"
HOST=$(hostname -s)
CPUS=$(nproc)

cat >"$ETC/slurm.conf.new" <<EOF
# written by tests/slurm/start_local_slurm.sh: one node, no GPUs, no cgroups
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
PropagatePrioProcess=1
MinJobAge=3600
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
NodeName=$HOST CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
if [ -f "$ETC/slurm.conf" ] && ! cmp -s "$ETC/slurm.conf" "$ETC/slurm.conf.new" \
    && scontrol ping 2>/dev/null | grep -q UP; then
  scontrol shutdown >/dev/null 2>&1  # slurmctld and slurmd save their state and exit; started again below
  waitfor 60 bash -c '! scontrol ping 2>/dev/null | grep -q UP' || fail "slurmctld did not stop for the new slurm.conf"
  waitfor 60 bash -c "! { [ -f '$STATE/run/slurmd.pid' ] && kill -0 \$(cat '$STATE/run/slurmd.pid') 2>/dev/null; }" \
    || fail "slurmd did not stop for the new slurm.conf"
fi
mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"

cat >"$ETC/slurmdbd.conf" <<EOF
# written by tests/slurm/start_local_slurm.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=graft_slurm_acct
EOF
chmod 600 "$ETC/slurmdbd.conf"

# munge (its own user; the key comes with the package)
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
  [ -s /etc/munge/munge.key ] || { mungekey --create >/dev/null 2>&1 || fail "no /etc/munge/munge.key"; }
  chown munge:munge /etc/munge/munge.key 2>/dev/null
  runuser -u munge -- /usr/sbin/munged || fail "munged did not start"
  waitfor 20 bash -c 'munge -n </dev/null | unmunge' || fail "munged does not answer"
fi

# MariaDB for slurmdbd (root over the unix socket)
if ! mariadb-admin ping >/dev/null 2>&1; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >"$STATE/log/mariadb-install.log" 2>&1 \
    || fail "mariadb-install-db failed (log: $STATE/log/mariadb-install.log)"
  setsid /usr/sbin/mariadbd --user=mysql --innodb-buffer-pool-size=32M \
    >"$STATE/log/mariadb.log" 2>&1 </dev/null &
  waitfor 60 mariadb-admin ping || fail "mariadbd does not answer (log: $STATE/log/mariadb.log)"
fi

if ! sacctmgr -n show cluster >/dev/null 2>&1; then
  setsid /usr/sbin/slurmdbd >"$STATE/log/slurmdbd.out" 2>&1 </dev/null
  waitfor 60 sacctmgr -n show cluster || fail "slurmdbd does not answer (log: $STATE/log/slurmdbd.log)"
fi
sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER" \
  || sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail "sacctmgr add cluster $CLUSTER failed"

if ! scontrol ping 2>/dev/null | grep -q UP; then
  setsid /usr/sbin/slurmctld >"$STATE/log/slurmctld.out" 2>&1 </dev/null
  waitfor 60 bash -c 'scontrol ping | grep -q UP' || fail "slurmctld does not answer (log: $STATE/log/slurmctld.log)"
fi
if ! sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then
  [ -f "$STATE/run/slurmd.pid" ] && kill -0 "$(cat "$STATE/run/slurmd.pid")" 2>/dev/null \
    || setsid /usr/sbin/slurmd >"$STATE/log/slurmd.out" 2>&1 </dev/null
  waitfor 60 bash -c "sinfo -h -N -o '%T' | grep -Eq '^(idle|mixed|allocated)'" \
    || fail "node $HOST is not idle: $(sinfo -h -N -o '%T %E' 2>&1 | head -1) (log: $STATE/log/slurmd.log)"
fi
echo "SLURM_CONF=$SLURM_CONF"
