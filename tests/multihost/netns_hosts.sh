# Hosts made of Linux network namespaces on one machine, for the multi-host scripts (sourced;
# bash). The caller sets prefix (namespace names), net (the /24's first three octets), nhosts
# and a log function. Host i is namespace $prefix-h$i with address $net.$i on eth0, joined to
# the others by a bridge in namespace $prefix-sw.

ns_sw=$prefix-sw
host_ns() { echo "$prefix-h$1"; }
host_ip() { echo "$net.$1"; }

# Deletes the namespaces, killing only the processes inside them (what the script started).
netns_cleanup() {
  local ns pids
  for ns in $(for i in $(seq 1 "$nhosts"); do host_ns "$i"; done) "$ns_sw"; do
    if ip netns list | grep -qw "^$ns"; then
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -n "$pids" ] && kill -9 $pids 2>/dev/null
      ip netns del "$ns" 2>/dev/null || log "could not delete namespace $ns"
    fi
  done
}

# Whether any of the namespaces exists (left by an earlier run).
netns_exist() {
  local ns
  for ns in "$ns_sw" $(for i in $(seq 1 "$nhosts"); do host_ns "$i"; done); do
    ip netns list | grep -qw "^$ns" && return 0
  done
  return 1
}

# The switch and the hosts. Each veth pair is created inside the switch namespace, its peer
# directly in the host's.
netns_make() {
  local i ns
  ip netns add "$ns_sw" || return 1
  ip -n "$ns_sw" link set lo up
  ip -n "$ns_sw" link add br0 type bridge || return 1
  ip -n "$ns_sw" link set br0 up
  for i in $(seq 1 "$nhosts"); do
    ns=$(host_ns "$i")
    ip netns add "$ns" || return 1
    ip -n "$ns" link set lo up
    ip -n "$ns_sw" link add "h${i}p" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$ns_sw" link set "h${i}p" master br0 up
    ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}
