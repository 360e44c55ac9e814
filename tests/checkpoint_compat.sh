#!/usr/bin/env bash
# Checkpoints across builds: each checkpoint written by one aiacc_checkpoint_tool is verified by
# the other (format 5, torch.save's format).
#   checkpoint_compat.sh SELF_TOOL PEER_TOOL WORKDIR
# With PEER_TOOL = SELF_TOOL it checks one build against itself.
set -euo pipefail
self=$1 peer=$2 dir=$3
[ -x "$peer" ] || { echo "checkpoint_compat: the other build's tool $peer is missing: build it first" >&2; exit 1; }
mkdir -p "$dir"
"$peer" write "$dir/peer.ckpt"
"$self" verify "$dir/peer.ckpt"
"$self" write "$dir/self.ckpt"
"$peer" verify "$dir/self.ckpt"
