#!/usr/bin/env bash
# Install the host packages envforge needs besides Python ones: debootstrap (to build the
# sandbox base image without a registry) and Debian's Chromium with its chromedriver (for the
# headless-browser test of the Dagster UI; no browser downloads), kubectl (the Kubernetes
# manifests' client-side dry run; Debian's kubernetes-client when none is installed), iproute2
# (the local fleet engines' bridges) and prometheus with promtool (the observability test scrapes
# a real rollout and checks the alert rules; only started by tests, never as a service) and nginx
# (the proxy in front of the service's replicas, `envforge service serve --replicas N`; run by that
# command, never as a system service). Idempotent.
set -euo pipefail
say() { printf '[host-packages] %s\n' "$*" >&2; }

missing=()
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)   # fleet-engine.sh gives each local node engine a bridge
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || missing+=(prometheus)
[ -x /usr/sbin/nginx ] || missing+=(nginx-light)   # the service replicas' proxy (docs/service.md)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  say "ERROR: missing ${missing[*]} and not root; fix: sudo apt-get install -y ${missing[*]}"
  exit 1
fi
say "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq "${missing[@]}" >/dev/null
