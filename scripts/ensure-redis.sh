#!/usr/bin/env bash
# Makes sure a Redis answers at TOLLGATE_REDIS_ADDR (default 127.0.0.1:6379):
# installs redis-server from Debian's packages if it is missing and starts it
# on loopback, keeping nothing on disk, when nothing answers.
set -euo pipefail
addr="${TOLLGATE_REDIS_ADDR:-127.0.0.1:6379}"
host="${addr%:*}"
port="${addr##*:}"

ping_redis() {
  # The braces keep 2>/dev/null to this exec: on exec itself it would
  # silence the rest of the script.
  { exec 3<>"/dev/tcp/${host}/${port}"; } 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  local line=""
  read -r -t 2 line <&3 || true
  exec 3>&- 3<&-
  [[ "$line" == +PONG* ]]
}

if ping_redis; then echo "redis answers at ${addr}"; exit 0; fi

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server is not installed; installing it from Debian's packages"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
echo "starting redis-server on ${host}:${port}"
redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "${port}" --save "" --appendonly no
for _ in $(seq 1 50); do
  if ping_redis; then echo "redis answers at ${addr}"; exit 0; fi
  sleep 0.1
done
echo "redis did not answer at ${addr}" >&2
exit 1
