#!/usr/bin/env bash
# Two (or more) pretend hosts on this machine: network namespaces bfnv1, bfnv2, ... each with
# one veth leg on a bridge in the root namespace (10.213.77.0/24: host i is 10.213.77.i, the
# root namespace 10.213.77.254), egress rate-limited by tc tbf.
#
#   bench/netns/hosts.sh up [N_HOSTS] [RATE]     # default: 2 hosts, 1gbit; RATE none: no limit
#   bench/netns/hosts.sh down [N_HOSTS]
#
# BF_NETNS_PREFIX (default bfnv) and BF_NETNS_NET (default 10.213.77) name the namespaces, the
# bridge (PREFIXbr) and the /24, so that two sets can coexist; rsh.sh reads the same variables.
#
# Needs root (CAP_NET_ADMIN). Only private addresses on interfaces this script creates.
set -euo pipefail
cmd=${1:-up}; n=${2:-2}; rate=${3:-1gbit}
prefix=${BF_NETNS_PREFIX:-bfnv}; net=${BF_NETNS_NET:-10.213.77}; br=${prefix}br
case $cmd in
up)
  ip link add $br type bridge
  ip addr add $net.254/24 dev $br
  ip link set $br up
  for i in $(seq 1 "$n"); do
    ns=$prefix$i
    ip netns add $ns
    ip link add ${ns}h type veth peer name ${ns}n
    ip link set ${ns}n netns $ns
    ip link set ${ns}h master $br up
    ip netns exec $ns ip link set lo up
    ip netns exec $ns ip addr add $net.$i/24 dev ${ns}n
    ip netns exec $ns ip link set ${ns}n up
    # Everything this host sends to another host goes through the rate limiter.
    [ "$rate" = none ] ||
      ip netns exec $ns tc qdisc add dev ${ns}n root tbf rate "$rate" burst 256kb latency 10ms
  done
  ;;
down)
  for i in $(seq 1 "$n"); do
    ip netns del $prefix$i 2>/dev/null || true
  done
  ip link del $br 2>/dev/null || true
  ;;
*) echo "usage: $0 up|down [N_HOSTS] [RATE]" >&2; exit 2 ;;
esac
