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
# The user is CTest (this script's parent), which also runs the fixture's `down`.
export TROUPE_CLUSTER_USER=$PPID
# From a clean cluster: one left up by an interrupted run (a chaos campaign cut off
# mid-fault) may have a node partitioned or slowed. `down` removes only what `up` made,
# and refuses while another user (a campaign running now) is alive: then so do we.
if ! out=$("$cluster" down 2>&1); then
  echo "$out" >&2
  [[ $out == *"in use by"* ]] && { echo "FAIL: the virtual cluster is in use; wait for it or stop that user" >&2; exit 1; }
fi
"$cluster" up "$nodes"
exec "$cluster" use "$PPID" "ctest cluster tests"
