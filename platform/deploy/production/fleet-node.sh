#!/usr/bin/env bash
# Entrypoint of a sandbox node (the fleet's Ray workers): its own Docker engine, then a Ray worker
# that joins the head and advertises how many sandboxes it may hold. The node agent the dispatcher
# starts here reads DOCKER_HOST from this environment (unset: the engine started below).
#
#   ENVFORGE_RAY_ADDRESS     the head's GCS address, e.g. ray-head:6379 (required)
#   ENVFORGE_NODE_SANDBOXES  sandboxes this node may lease at once (default 16; docs/fleet.md sizes it)
#   ENVFORGE_NODE_DOCKERD    1 (default): start dockerd in this container (needs --privileged);
#                            0: use the engine at DOCKER_HOST (e.g. the host's socket, mounted)
set -euo pipefail
: "${ENVFORGE_RAY_ADDRESS:?set ENVFORGE_RAY_ADDRESS to the Ray head (HOST:6379)}"
SANDBOXES="${ENVFORGE_NODE_SANDBOXES:-16}"
[[ "$SANDBOXES" =~ ^[0-9]+$ ]] || { echo "ENVFORGE_NODE_SANDBOXES=$SANDBOXES: expected a whole number" >&2; exit 2; }

if [ "${ENVFORGE_NODE_DOCKERD:-1}" = 1 ]; then
  # A restarted container keeps its files: the pid files of the engine it ran before would make
  # dockerd (and its containerd) refuse to start ("pid file found").
  rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
  # Sandboxes have no network, so the inner engine needs no bridge or NAT rules.
  dockerd --host unix:///var/run/docker.sock --bridge=none --iptables=false >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 1 240); do docker version >/dev/null 2>&1 && break; sleep 0.25; done
  docker version >/dev/null 2>&1 || { tail -n 30 /var/log/dockerd.log >&2; echo "dockerd did not start" >&2; exit 1; }
fi

exec ray start --address "$ENVFORGE_RAY_ADDRESS" --num-cpus "$(nproc)" \
  --resources "{\"envforge_sandboxes\": $SANDBOXES}" --disable-usage-stats --block
