#!/usr/bin/env bash
# netlab.sh: an emulated cluster on one machine. Each "node" is a network namespace with its own
# address on eth0; all nodes hang off one bridge that lives in a namespace of its own (the
# "switch"), and each node's egress is rate-limited with tc tbf. Traffic between the ranks of
# one node stays on that node's own interfaces (fast); traffic between nodes crosses the limited
# links. The host's own interfaces and routes are never touched.
#
#   scripts/netlab.sh up --nodes M --bw RATE                     e.g. --bw 1gbit, 5gbit, 500mbit
#   scripts/netlab.sh run NODE -- CMD [ARGS...]                  runs CMD inside node NODE (0..M-1)
#   scripts/netlab.sh addr NODE                                  prints NODE's address
#   scripts/netlab.sh status                                     nodes, addresses, qdiscs
#   scripts/netlab.sh down                                       removes everything it created
#
# Names: namespaces aiacc-lab-n<i> and aiacc-lab-sw; addresses 10.231.0.<i+1>/24 (only inside the
# namespaces); AIACC_NETLAB_PREFIX and AIACC_NETLAB_SUBNET change both (the tests' own lab). `up` on an existing lab replaces it. A failed `up` removes what it made. Needs root
# (namespaces and qdiscs); says so otherwise.
set -euo pipefail

PREFIX=${AIACC_NETLAB_PREFIX:-aiacc-lab}    # tests use their own prefix and subnet
SUBNET=${AIACC_NETLAB_SUBNET:-10.231.0}
SWITCH=$PREFIX-sw

die() { echo "netlab: $*" >&2; exit 1; }
need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN); try: sudo $0 $*"
  command -v ip >/dev/null && command -v tc >/dev/null || die "needs ip and tc (Debian package iproute2; scripts/setup.sh installs it)"
}
nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-n[0-9]+$" | sort -V || true; }
addr_of() { echo "$SUBNET.$(( $1 + 1 ))"; }

down() {
  local n
  for n in $(nodes) $(ip netns list 2>/dev/null | awk '{print $1}' | grep -x "$SWITCH" || true); do
    ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true  # its veth ends go with it
  done
}

# Bytes of burst for a tbf at RATE: 2 ms worth, at least 64 KiB (a GSO segment), at most 4 MiB.
burst_for() {
  local rate=$1 bits
  bits=$(echo "$rate" | awk '{ r = tolower($1); m = 1;
      if (r ~ /gbit$/) m = 1e9; else if (r ~ /mbit$/) m = 1e6; else if (r ~ /kbit$/) m = 1e3;
      sub(/[a-z]+$/, "", r); printf "%.0f", r * m }')
  [ "$bits" -gt 0 ] 2>/dev/null || die "cannot read --bw '$rate' (examples: 1gbit, 5gbit, 500mbit)"
  awk -v b="$bits" 'BEGIN { x = b / 8 * 0.002; if (x < 65536) x = 65536; if (x > 4194304) x = 4194304; printf "%.0f", x }'
}

up() {
  local m=0 bw=""
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) m=$2; shift 2 ;;
      --bw) bw=$2; shift 2 ;;
      *) die "up: unknown argument '$1' (usage: up --nodes M --bw RATE)" ;;
    esac
  done
  [ "$m" -ge 1 ] 2>/dev/null && [ "$m" -le 200 ] || die "up: --nodes must be 1..200"
  [ -n "$bw" ] || die "up: --bw RATE is required (e.g. 1gbit)"
  local burst; burst=$(burst_for "$bw")
  down
  trap 'echo "netlab: up failed; removing what was made" >&2; down' ERR
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link add br0 type bridge
  ip -n "$SWITCH" link set br0 up
  ip -n "$SWITCH" link set lo up
  local i ns
  for i in $(seq 0 $((m - 1))); do
    ns=$PREFIX-n$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The veth pair is created inside the switch namespace, then one end moves to the node.
    ip -n "$SWITCH" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$SWITCH" link set "p$i" master br0
    ip -n "$SWITCH" link set "p$i" up
    ip -n "$ns" addr add "$(addr_of "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    # latency here bounds the queue (packets waiting longer are dropped), not propagation delay:
    # there is no netem on this kernel, so links add no fixed delay.
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$bw" burst "$burst" latency 100ms
  done
  trap - ERR
  echo "netlab: $m node(s) up, egress $bw each (tbf burst $burst bytes); addresses $(addr_of 0)..$(addr_of $((m - 1)))"
}

run() {
  local node=${1:-}
  [ -n "$node" ] || die "run: usage: run NODE -- CMD [ARGS...]"
  shift
  [ "${1:-}" = "--" ] && shift
  [ $# -gt 0 ] || die "run: no command given"
  ip netns list | awk '{print $1}' | grep -qx "$PREFIX-n$node" || die "run: node $node does not exist (netlab.sh up first)"
  exec ip netns exec "$PREFIX-n$node" "$@"
}

status() {
  local n
  for n in $(nodes); do
    echo "$n: $(ip -n "$n" -4 -o addr show dev eth0 | awk '{print $4}')  $(tc -n "$n" qdisc show dev eth0 | head -1)"
  done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  up) need_root; up "$@" ;;
  down) need_root; down; echo "netlab: down" ;;
  run) need_root; run "$@" ;;
  addr) [ -n "${1:-}" ] || die "addr: usage: addr NODE"; addr_of "$1" ;;
  status) need_root; status ;;
  *) die "usage: netlab.sh up --nodes M --bw RATE | run NODE -- CMD | addr NODE | status | down" ;;
esac
