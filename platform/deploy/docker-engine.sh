#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, installing and starting one if needed.
#
# Idempotent: when the engine already answers it returns at once. Uses Debian's docker.io
# (no container registry is ever contacted). Exit codes: 0 ready, 1 cannot install or start.
set -euo pipefail

SOCK="${ENVFORGE_DOCKER_SOCKET:-/var/run/docker.sock}"
LOG="${ENVFORGE_DOCKERD_LOG:-/var/log/envforge-dockerd.log}"
WAIT_S="${ENVFORGE_DOCKER_WAIT_S:-60}"

say() { printf '[docker-engine] %s\n' "$*" >&2; }
fail() { say "ERROR: $1"; say "fix: $2"; exit 1; }

engine_answers() { docker -H "unix://$SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
# A killed dockerd can linger as a zombie when nothing reaps it (its parent is gone), and
# pgrep/kill -0 still see it: only a process that is not a zombie counts as running.
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != "Z" ]; }
dockerd_running() {
  local pid
  for pid in $(pgrep -x dockerd 2>/dev/null); do alive "$pid" && return 0; done
  return 1
}

if command -v docker >/dev/null 2>&1 && engine_answers; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || fail "dockerd is not installed and this script is not root" \
    "run 'sudo apt-get install -y docker.io' once, or run this script as root"
  command -v apt-get >/dev/null 2>&1 || fail "dockerd is missing and apt-get is not available" \
    "install a Docker engine by hand, start it, and set DOCKER_HOST if it is not $SOCK"
  say "installing Debian's docker.io (once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || fail "apt-get update failed" "check the package mirror in /etc/apt/sources.list"
  apt-get install -y -qq docker.io >/dev/null || fail "apt-get install docker.io failed" \
    "run 'apt-get install -y docker.io' by hand and read its error"
fi

[ "$(id -u)" = 0 ] || fail "the Docker engine is not running and starting it needs root" \
  "start it with 'sudo dockerd &' or 'sudo systemctl start docker'"

# A dockerd that was killed leaves its pid file behind, and a new one refuses to start.
if [ -f /var/run/docker.pid ]; then
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -z "$pid" ] || ! alive "$pid"; then
    say "removing stale /var/run/docker.pid (pid ${pid:-?} is gone)"
    rm -f /var/run/docker.pid
  fi
fi
if ! dockerd_running; then
  # containerd's own pid file can go stale the same way.
  rm -f /var/run/docker/containerd/containerd.pid 2>/dev/null || true
  say "starting dockerd (log: $LOG)"
  nohup setsid dockerd -H "unix://$SOCK" >"$LOG" 2>&1 </dev/null &
fi

for _ in $(seq 1 $((WAIT_S * 4))); do
  engine_answers && { say "engine ready"; exit 0; }
  sleep 0.25
done
tail -n 20 "$LOG" >&2 2>/dev/null || true
fail "dockerd did not answer on $SOCK within ${WAIT_S}s" "read $LOG; a stale /var/run/docker.pid or a missing kernel feature is the usual cause"
