#!/usr/bin/env bash
# The cluster tests' setup: scripts/cluster down, then up N, or exit 77 (skip) where
# network namespaces cannot be made, so the scenarios skip instead of failing.
set -euo pipefail
cluster=$1 nodes=$2
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIPPED: the virtual cluster needs root (network namespaces, a bridge)"; exit 77
fi
probe=troupe-probe-$$
if ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIPPED: network namespaces cannot be made here (ip netns add failed)"; exit 77
fi
ip netns del "$probe"
# From a clean cluster: one left up by an interrupted run (a chaos campaign cut off
# mid-fault) may have a node partitioned or slowed. `down` removes only what `up` made.
"$cluster" down > /dev/null 2>&1 || true
exec "$cluster" up "$nodes"
