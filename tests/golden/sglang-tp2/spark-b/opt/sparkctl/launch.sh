#!/bin/sh
# Rendered by sparkctl 0.1.0 for spark-b: profile sglang-tp2, sglang v0.5.4-sm121,
# replica 0, rank 1 of 2. `sparkctl up` rewrites this file.
set -eu
ENV_FILE=/etc/sparkctl/engine.env
SYSFS=/sys

# The env file's values are quoted for sh: sourcing it sets them and runs nothing.
set -a
# The env file is rendered beside this script (a per-node path shellcheck cannot follow).
# shellcheck source=/dev/null
. "$ENV_FILE"
set +a

# The RoCEv2 IPv4 GID index drifts (3, 4 and 5 seen on Sparks): resolve it per
# device now. An empty value would mean index 0, the link-local GID.
gid_index() {
  dir="$SYSFS/class/infiniband/$1/ports/1"
  n=0
  while [ "$n" -lt 16 ]; do
    t=$(cat "$dir/gid_attrs/types/$n" 2>/dev/null || true)
    g=$(cat "$dir/gids/$n" 2>/dev/null || true)
    case "$t:$g" in
      "RoCE v2:0000:0000:0000:0000:0000:ffff:"*) echo "$n"; return 0 ;;
    esac
    n=$((n + 1))
  done
  return 1
}
GID=""
for dev in rocep1s0f0 roceP2p1s0f0; do
  i=$(gid_index "$dev") || { echo "sparkctl: no RoCEv2 IPv4 GID on $dev (is its address applied?)" >&2; exit 78; }
  if [ -n "$GID" ] && [ "$GID" != "$i" ]; then
    echo "sparkctl: RoCE GID index differs between devices ($GID vs $i on $dev); re-apply the fabric addresses" >&2
    exit 78
  fi
  GID=$i
done
export NCCL_IB_GID_INDEX="$GID"
echo "sparkctl: NCCL_IB_GID_INDEX=$GID for rocep1s0f0,roceP2p1s0f0"

# docker gets the names only (-e NAME takes the value from this environment):
# its --env-file reader would keep the quotes as part of the values.
set --
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in [A-Za-z_]*=*) set -- "$@" -e "${line%%=*}" ;; esac
done < "$ENV_FILE"
exec docker run --rm --name sparkctl-engine \
  --network host --ipc host --device /dev/infiniband \
  --ulimit memlock=-1 --cap-add IPC_LOCK --gpus all \
  "$@" -e NCCL_IB_GID_INDEX \
  -v /srv/models:/srv/models:ro \
  sglang-spark:v0.5.4 \
  python3 -m sglang.launch_server --model-path /srv/models/Qwen3.8-Flash-Next-NVFP4 --served-model-name qwen3.8-flash-next --tp-size 2 --nnodes 2 --node-rank 1 --dist-init-addr 10.20.0.1:29500 --host 0.0.0.0 --port 30000 --context-length 262144 --mem-fraction-static 0.85 --enable-metrics
