#!/usr/bin/env bash
# Start (or stop) an extra Docker engine for one simulated fleet node on this machine.
#
#   platform/deploy/fleet-engine.sh start NAME   # prints the engine's DOCKER_HOST on stdout
#   platform/deploy/fleet-engine.sh stop NAME
#   platform/deploy/fleet-engine.sh host NAME    # the DOCKER_HOST it has (or would have)
#
# Each engine has its own socket, data root, exec root (containerd inside it), pid file and
# cgroup parent, so it shares nothing with the machine's main engine: it never touches
# /var/run/docker.sock, /var/lib/docker or /var/run/docker.pid. It runs without iptables rules or
# masquerading (`--iptables=false --ip-masq=false`): sandboxes have no network anyway, and the
# main engine's rules stay as they are. It gets a bridge of its own (efb-<hash>, a /24 in
# 172.20-29.x) rather than `--bridge=none`: with `--bridge=none` dockerd deletes the host's docker0
# at start (moby's removeDefaultBridgeInterface), and on a shared host that breaks every build of
# the main engine. Idempotent; needs root.
set -euo pipefail

ACTION="${1:-}"; NAME="${2:-}"
[[ "$ACTION" =~ ^(start|stop|host)$ && "$NAME" =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || {
  echo "usage: $0 start|stop|host NAME   (NAME: lowercase letters, digits, '-')" >&2; exit 2; }

RUN_DIR="${ENVFORGE_FLEET_RUN_DIR:-/run/envforge-fleet}/$NAME"
DATA_DIR="${ENVFORGE_FLEET_DATA_DIR:-/var/lib/envforge-fleet}/$NAME"
SOCK="$RUN_DIR/docker.sock"
PIDFILE="$RUN_DIR/docker.pid"
LOG="$RUN_DIR/dockerd.log"
WAIT_S="${ENVFORGE_DOCKER_WAIT_S:-60}"

sum=$(printf '%s' "$NAME" | cksum | cut -d' ' -f1)
BRIDGE="efb-${sum:0:8}"                                   # at most 15 characters (IFNAMSIZ)
BRIDGE_CIDR="172.$((20 + sum % 10)).$(( (sum / 10) % 250 + 1 )).1/24"

say() { printf '[fleet-engine %s] %s\n' "$NAME" "$*" >&2; }
answers() { docker -H "unix://$SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != "Z" ]; }

case "$ACTION" in
  host)
    echo "unix://$SOCK"; exit 0 ;;
  stop)
    if [ -f "$PIDFILE" ]; then
      pid=$(cat "$PIDFILE" 2>/dev/null || true)
      if [ -n "$pid" ] && alive "$pid"; then
        kill "$pid"
        for _ in $(seq 1 80); do alive "$pid" || break; sleep 0.25; done
        alive "$pid" && kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$PIDFILE"
    fi
    ip link del "$BRIDGE" 2>/dev/null || true
    say "stopped"; exit 0 ;;
esac

if answers; then echo "unix://$SOCK"; exit 0; fi
[ "$(id -u)" = 0 ] || { say "ERROR: starting a Docker engine needs root"; exit 1; }
command -v dockerd >/dev/null 2>&1 || { say "ERROR: dockerd is not installed (run platform/deploy/docker-engine.sh first)"; exit 1; }
mkdir -p "$RUN_DIR" "$DATA_DIR"
if [ -f "$PIDFILE" ]; then
  pid=$(cat "$PIDFILE" 2>/dev/null || true)
  if [ -z "$pid" ] || ! alive "$pid"; then rm -f "$PIDFILE"; fi   # a killed engine's stale pid file
fi
rm -f "$RUN_DIR/exec/containerd/containerd.pid" 2>/dev/null || true
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add name "$BRIDGE" type bridge
  ip addr add "$BRIDGE_CIDR" dev "$BRIDGE"
fi
ip link set "$BRIDGE" up
say "starting dockerd (socket $SOCK, data $DATA_DIR, bridge $BRIDGE, log $LOG)"
nohup setsid dockerd -H "unix://$SOCK" --data-root "$DATA_DIR" --exec-root "$RUN_DIR/exec" \
  --pidfile "$PIDFILE" --bridge="$BRIDGE" --iptables=false --ip-masq=false \
  --cgroup-parent "envforge-fleet-$NAME" >"$LOG" 2>&1 </dev/null &
for _ in $(seq 1 $((WAIT_S * 4))); do
  answers && { say "ready"; echo "unix://$SOCK"; exit 0; }
  sleep 0.25
done
tail -n 20 "$LOG" >&2 || true
say "ERROR: dockerd did not answer on $SOCK within ${WAIT_S}s (log: $LOG)"; exit 1
