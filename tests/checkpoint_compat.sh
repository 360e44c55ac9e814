#!/usr/bin/env bash
# Checkpoints across builds: each checkpoint written by one aiacc_checkpoint_tool is verified by
# the other, in each format (5: torch.save's format; 4: a LibTorch archive with aiacc's own
# optimizer layout and the whole training state; 2: torch::optim's layout; 4 and 2 still read).
#   checkpoint_compat.sh SELF_TOOL PEER_TOOL WORKDIR
# With PEER_TOOL = SELF_TOOL it checks one build against itself.
set -euo pipefail
self=$1 peer=$2 dir=$3
[ -x "$peer" ] || { echo "checkpoint_compat: the other build's tool $peer is missing: build it first" >&2; exit 1; }
mkdir -p "$dir"
for format in 5 4 2; do
  "$peer" write "$dir/peer.f$format.ckpt" --format $format
  "$self" verify "$dir/peer.f$format.ckpt"
  "$self" write "$dir/self.f$format.ckpt" --format $format
  "$peer" verify "$dir/self.f$format.ckpt"
done
