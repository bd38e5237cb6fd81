#!/usr/bin/env bash
# Makes sure the Redis processes that idempotency/redisstore's replication and
# Cluster tests need answer on 127.0.0.1, starting what does not and repairing
# what is out of shape; safe to run again at any time (it changes nothing that
# is already right) and bounded in time. Nothing is kept on disk but each
# node's log and Cluster config under the run directory.
#
#   - a primary at TOLLGATE_REDIS_REPLICATED_ADDR (default 127.0.0.1:6390)
#     with one replica on the next port (6391);
#   - a Redis Cluster of three primaries at TOLLGATE_REDIS_CLUSTER_ADDRS
#     (default 127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303) and one replica,
#     of the first primary, on the port after the last (7304), so that WAIT
#     is tested against a slot with a replica and slots without one.
#
# The ports are the topology's own: a Cluster that does not come back to
# cluster_state:ok (a node restarted without its peers, say) is flushed and
# created anew. TOLLGATE_REDIS_RUN_DIR sets the run directory (default
# ${TMPDIR:-/tmp}/tollgate-redis-topology).
set -euo pipefail

replicated="${TOLLGATE_REDIS_REPLICATED_ADDR:-127.0.0.1:6390}"
cluster="${TOLLGATE_REDIS_CLUSTER_ADDRS:-127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303}"
run_dir="${TOLLGATE_REDIS_RUN_DIR:-${TMPDIR:-/tmp}/tollgate-redis-topology}"

die() { echo "ensure-redis-topology: $*" >&2; exit 1; }

port_of() {
  [[ "${1%:*}" == 127.0.0.1 ]] || die "$1: this script starts Redis on 127.0.0.1 only"
  local p="${1##*:}"
  [[ "$p" =~ ^[0-9]+$ ]] || die "$1: not host:port"
  echo "$p"
}

primary=$(port_of "$replicated")
replica=$((primary + 1))
primaries=()
IFS=, read -ra addrs <<<"$cluster"
for a in "${addrs[@]}"; do primaries+=("$(port_of "$a")"); done
((${#primaries[@]} >= 3)) || die "a Redis Cluster needs at least 3 primaries, got: $cluster"
cluster_replica=$((primaries[-1] + 1))
nodes=$((${#primaries[@]} + 1))

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server or redis-cli is not installed; installing them from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi

mkdir -p "$run_dir"
# One run at a time: a second one waits for the first, then finds all in place.
exec 9>"$run_dir/lock"
flock -w 120 9 || die "another run holds $run_dir/lock"

cli() { local port=$1; shift; timeout 5 redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null | tr -d '\r'; }
answers() { [[ "$(cli "$1" PING || true)" == PONG ]]; }
info() { cli "$1" INFO "$2" | sed -n "s/^$3://p"; }
cinfo() { cli "$1" CLUSTER INFO | sed -n "s/^$2://p"; }

# wait_until SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds;
# fails once SECONDS of wall-clock time have passed (a check may itself take
# seconds on a loaded machine).
wait_until() {
  local end=$((SECONDS + $1)); shift
  while ((SECONDS < end)); do
    if "$@"; then return 0; fi
    sleep 0.1
  done
  "$@"
}

start() {
  local port=$1; shift
  if answers "$port"; then return 0; fi
  echo "starting redis-server on 127.0.0.1:${port} $*"
  mkdir -p "$run_dir/$port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$run_dir/$port" \
    --pidfile "$run_dir/$port/redis.pid" --logfile "$run_dir/$port/redis.log" \
    --save "" --appendonly no --maxmemory-policy noeviction \
    --repl-diskless-sync yes --repl-diskless-sync-delay 0 "$@" 9>&- # the daemon must not hold the lock
  wait_until 10 answers "$port" || die "no answer at 127.0.0.1:${port}; see $run_dir/$port/redis.log"
}

# --- the replicated pair ---------------------------------------------------

in_sync() { # replica port, primary port
  [[ "$(info "$1" replication role)" == slave &&
    "$(info "$1" replication master_port)" == "$2" &&
    "$(info "$1" replication master_link_status)" == up &&
    "$(info "$1" replication master_sync_in_progress)" == 0 ]]
}

start "$primary"
start "$replica" --replicaof 127.0.0.1 "$primary"
[[ "$(info "$primary" server redis_mode)" == standalone ]] || die "127.0.0.1:${primary} runs in cluster mode"
if [[ "$(info "$primary" replication role)" != master ]]; then
  echo "127.0.0.1:${primary} is a replica; making it the primary again"
  cli "$primary" REPLICAOF NO ONE >/dev/null
fi
if [[ "$(info "$replica" replication role)" != slave || "$(info "$replica" replication master_port)" != "$primary" ]]; then
  echo "127.0.0.1:${replica} is not a replica of 127.0.0.1:${primary} (a failover test cut short?); making it one"
  cli "$replica" REPLICAOF 127.0.0.1 "$primary" >/dev/null
fi
wait_until 30 in_sync "$replica" "$primary" || die "127.0.0.1:${replica} did not come in sync with 127.0.0.1:${primary} within 30s"
echo "redis primary at 127.0.0.1:${primary}, its replica at 127.0.0.1:${replica}"

# --- the Cluster ------------------------------------------------------------

# A Cluster node leaves a replica out of CLUSTER SLOTS, where clients learn
# the topology, while the replica's replication offset is 0; a primary's ping
# every second moves it soon after the replica attaches.
for p in "${primaries[@]}" "$cluster_replica"; do
  start "$p" --cluster-enabled yes --cluster-config-file "$run_dir/$p/nodes.conf" --cluster-node-timeout 5000 \
    --repl-ping-replica-period 1
  [[ "$(info "$p" server redis_mode)" == cluster ]] || die "127.0.0.1:${p} answers but is not in cluster mode"
done

healthy() {
  local p
  for p in "${primaries[@]}"; do
    [[ "$(cinfo "$p" cluster_state)" == ok &&
      "$(cinfo "$p" cluster_known_nodes)" == "$nodes" &&
      "$(cinfo "$p" cluster_slots_assigned)" == 16384 &&
      "$(info "$p" replication role)" == master ]] || return 1
  done
  [[ "$(cinfo "$cluster_replica" cluster_state)" == ok ]] && in_sync "$cluster_replica" "${primaries[0]}" || return 1
  # Every node's view (clients read the topology from any) has the replica.
  for p in "${primaries[@]}" "$cluster_replica"; do
    cli "$p" CLUSTER NODES | grep -q "^[0-9a-f]* 127.0.0.1:${cluster_replica}@[0-9]* \(myself,\)\?slave " || return 1
    cli "$p" CLUSTER SLOTS | grep -qx "$cluster_replica" || return 1
  done
}

fresh() {
  local p
  for p in "${primaries[@]}" "$cluster_replica"; do
    [[ "$(cinfo "$p" cluster_known_nodes)" == 1 && "$(cinfo "$p" cluster_slots_assigned)" == 0 ]] || return 1
  done
}

primaries_ok() {
  local p
  for p in "${primaries[@]}"; do [[ "$(cinfo "$p" cluster_state)" == ok ]] || return 1; done
}

create() {
  local hosts=() p
  for p in "${primaries[@]}"; do hosts+=("127.0.0.1:$p"); done
  echo "creating a Redis Cluster of ${hosts[*]}"
  timeout 60 redis-cli --cluster create "${hosts[@]}" --cluster-replicas 0 --cluster-yes >"$run_dir/create.log" 2>&1 ||
    { cat "$run_dir/create.log" >&2; die "redis-cli --cluster create failed"; }
  wait_until 30 primaries_ok || die "no cluster_state:ok on every primary within 30s"
  local id
  id=$(cli "${primaries[0]}" CLUSTER MYID)
  echo "adding 127.0.0.1:${cluster_replica} as a replica of 127.0.0.1:${primaries[0]}"
  timeout 60 redis-cli --cluster add-node "127.0.0.1:${cluster_replica}" "127.0.0.1:${primaries[0]}" \
    --cluster-slave --cluster-master-id "$id" >"$run_dir/add-node.log" 2>&1 ||
    { cat "$run_dir/add-node.log" >&2; die "redis-cli --cluster add-node failed"; }
}

reset() {
  echo "the Cluster is not healthy; flushing it and creating it anew"
  local p
  # A replica cannot FLUSHALL (CLUSTER RESET empties it); a master with keys
  # cannot be reset, and any node may be a master after a failover.
  for p in "$cluster_replica" "${primaries[@]}"; do
    cli "$p" FLUSHALL >/dev/null || true
    cli "$p" CLUSTER RESET HARD >/dev/null || true
  done
  wait_until 10 fresh || die "the Cluster nodes did not reset"
}

if ! healthy; then
  if fresh; then
    create
  elif ! wait_until 15 healthy; then # a restarted node rejoining settles in seconds
    reset
    create
  fi
  wait_until 60 healthy || die "the Cluster is not healthy (cluster_state:ok, every node known, replica in sync) 60s after its creation"
fi
# A run killed mid-test may leave a node with a test's setting (an evicting
# maxmemory-policy, a tiny maxmemory, a slow hz) that the next run's tests would trip
# over: set both back, on the pair's nodes too.
for p in "$primary" "$replica" "${primaries[@]}" "$cluster_replica"; do
  cli "$p" CONFIG SET maxmemory-policy noeviction >/dev/null
  cli "$p" CONFIG SET maxmemory 0 >/dev/null
  cli "$p" CONFIG SET hz 10 >/dev/null
done
echo "redis cluster at ${cluster} (cluster_state:ok), replica of 127.0.0.1:${primaries[0]} at 127.0.0.1:${cluster_replica}"
