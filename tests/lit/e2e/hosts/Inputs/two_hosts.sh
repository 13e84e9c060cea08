#!/usr/bin/env bash
# two_hosts.sh PROG DIR: PROG, a program compiled for a mesh of 4 devices, run
# under mpirun across two hosts: two Linux network namespaces joined by a veth
# pair, 10.77.0.1 and 10.77.0.2, two ranks on each. mpirun runs in the first
# namespace and starts the second host's daemon through an rsh agent
# (DIR/agent) that enters that host's namespace instead of using ssh. Only the
# TCP transport is allowed, on 10.77.0.0/24 (btl tcp and mpirun's own
# out-of-band traffic), so every message between ranks crosses a socket, and
# those between the hosts cross the veth pair.
#
# Stages, each a line on stdout (for FileCheck) and files in DIR:
#   where.log            each rank's address
#   run.log, run.err     3 steps across the hosts (--exact), and the bytes the
#                        second host's link received meanwhile
#   threads.log          the same 3 steps, the ranks as threads of one process
#   kill.log, kill.err   a long run whose ranks on the second host are killed
#                        (SIGKILL) once step 2 is logged
#   cut.log, cut.err     a long run (--timeout 3) whose link between the hosts
#                        goes down once step 2 is logged: the watchdogs on both
#                        sides name the ranks they no longer reach; the link
#                        comes back once one has, so mpirun can end the job
# Needs root (ip netns), iproute2 and mpirun. The namespaces (and the link
# with them) are removed on exit, whatever happens (trap).
set -euo pipefail

prog=$1
dir=$2
tag=tcc$$ # this run's namespaces and link: several runs may share the machine
ns1=$tag-h1
ns2=$tag-h2
mkdir -p "$dir"

cleanup() {
    for ns in "$ns1" "$ns2"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -9 "$pid" 2>/dev/null || true
        done
        ip netns delete "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT

ip netns add "$ns1"
ip netns add "$ns2"
ip link add "${tag}a" type veth peer name "${tag}b"
ip link set "${tag}a" netns "$ns1"
ip link set "${tag}b" netns "$ns2"
ip -n "$ns1" addr add 10.77.0.1/24 dev "${tag}a"
ip -n "$ns2" addr add 10.77.0.2/24 dev "${tag}b"
ip -n "$ns1" link set lo up
ip -n "$ns2" link set lo up
ip -n "$ns1" link set "${tag}a" up
ip -n "$ns2" link set "${tag}b" up
echo "hosts 10.77.0.1 and 10.77.0.2: namespaces $ns1 and $ns2"

# mpirun calls the agent as it would call ssh: [options] HOST COMMAND...
cat > "$dir/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1
shift
case "\$host" in
10.77.0.1) ns=$ns1 ;;
10.77.0.2) ns=$ns2 ;;
*) echo "agent: no host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$dir/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(ip netns exec "$ns1" mpirun --timeout 60 --mca plm_rsh_agent "$dir/agent"
    --host 10.77.0.1:2,10.77.0.2:2 -np 4 --mca btl self,tcp
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
    --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)

# The bytes the second host's end of the link has received so far.
rx_bytes() {
    ip -n "$ns2" -s -j link show "${tag}b" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'
}

# Wait (at most 60 s) until FILE has a line matching the pattern.
await_line() {
    for _ in $(seq 600); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

"${mpirun[@]}" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(ip -4 -o addr | grep -o "10\.77\.0\.[0-9]*")"' |
    sort > "$dir/where.log"
echo "placed: $(paste -s -d, "$dir/where.log")"

before=$(rx_bytes)
rc=0
"${mpirun[@]}" "$prog" --steps 3 --exact > "$dir/run.log" 2> "$dir/run.err" || rc=$?
echo "two hosts: exit $rc, the second host received $(($(rx_bytes) - before)) bytes"
rc=0
"$prog" --steps 3 --exact --comm threads > "$dir/threads.log" 2>&1 || rc=$?
echo "one process: exit $rc"

# Kill the second host's ranks (the processes there with an MPI rank; not its
# daemon) once step 2 is logged.
"${mpirun[@]}" "$prog" --steps 1000000 > "$dir/kill.log" 2> "$dir/kill.err" &
job=$!
await_line "$dir/kill.log" '^step  *2/' || echo "kill: step 2 never came"
killed=""
for pid in $(ip netns pids "$ns2"); do
    rank=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    if [ -n "$rank" ]; then
        kill -9 "$pid"
        killed="$killed $rank"
    fi
done
rc=0
wait "$job" || rc=$?
echo "killed ranks$(echo $killed | tr ' ' '\n' | sort | paste -s -d' ' | sed 's/^/ /') on 10.77.0.2: exit $rc"

# Cut the link between the hosts once step 2 is logged; bring it back once a
# watchdog has spoken (with the link down, mpirun could not reach the second
# host's daemon to end the job, and would wait for its own --timeout).
"${mpirun[@]}" "$prog" --steps 1000000 --timeout 3 > "$dir/cut.log" 2> "$dir/cut.err" &
job=$!
await_line "$dir/cut.log" '^step  *2/' || echo "cut: step 2 never came"
ip -n "$ns2" link set "${tag}b" down
await_line "$dir/cut.err" 'error: ' || echo "cut: no watchdog spoke"
ip -n "$ns2" link set "${tag}b" up
rc=0
wait "$job" || rc=$?
echo "cut the link: exit $rc"
