#!/bin/sh
# Rendered by sparkctl 0.1.0 for spark-04: profile tensorfold-tp4x2-switch, tensorfold tensorfold-4x-2026.10,
# replica 0, rank 3 of 4. `sparkctl up` rewrites this file.
set -eu
ENV_FILE=/etc/sparkctl/engine.env
SYSFS=/sys

# The env file's values are quoted for sh: sourcing it sets them and runs nothing.
set -a
# The env file is rendered beside this script (a per-node path shellcheck cannot follow).
# shellcheck source=/dev/null
. "$ENV_FILE"
set +a

# The RoCEv2 IPv4 GID index drifts (3, 4 and 5 seen on Sparks), and a port can
# carry more than one IPv4 GID (an IPv4 link-local 169.254.x.y beside the fabric
# address): resolve per device the RoCE v2 GID of the fabric address this node
# has on it. An empty value would mean index 0, the IPv6 link-local GID.
gid_index() {
  dir="$SYSFS/class/infiniband/$1/ports/1"
  n=0
  while [ "$n" -lt 32 ]; do
    t=$(cat "$dir/gid_attrs/types/$n" 2>/dev/null || true)
    g=$(cat "$dir/gids/$n" 2>/dev/null || true)
    if [ "$t:$g" = "RoCE v2:$2" ]; then
      echo "$n"
      return 0
    fi
    n=$((n + 1))
  done
  return 1
}
GID=""
# A port gets its address, and with it its GID, only once the neighbour's end has carrier
# (systemd-networkd configures no link without carrier unless ConfigureWithoutCarrier=,
# systemd.network(5)): a neighbour that boots minutes after this box is waited for here,
# up to serve.fabric_wait_s, instead of failing every start and using up the start limit.
# Only a persisted rank waits (systemd starts it at boot); an up or switch fails at once, naming the node.
WAIT_S=0
STEP_S=2
waited=0
for want in rocep1s0f1=0000:0000:0000:0000:0000:ffff:0a28:0004=10.40.0.4 roceP2p1s0f1=0000:0000:0000:0000:0000:ffff:0a29:0004=10.41.0.4; do
  dev=${want%%=*}
  rest=${want#*=}
  gid=${rest%%=*}
  addr=${rest#*=}
  while ! i=$(gid_index "$dev" "$gid"); do
    if [ "$waited" -ge "$WAIT_S" ]; then
      echo "sparkctl: no RoCEv2 GID for the fabric address $addr on $dev after waiting ${waited} s (serve.fabric_wait_s=$WAIT_S): is its address applied, does the neighbour's end have carrier? (show_gids $dev)" >&2
      exit 78
    fi
    if [ $((waited % 30)) -eq 0 ]; then
      echo "sparkctl: waiting for the RoCEv2 GID of the fabric address $addr on $dev (${waited} s of ${WAIT_S} s; the port has no address until the neighbour's end has carrier)"
    fi
    sleep "$STEP_S"
    waited=$((waited + STEP_S))
  done
  if [ -n "$GID" ] && [ "$GID" != "$i" ]; then
    echo "sparkctl: the fabric RoCE v2 GID index differs between devices ($GID vs $i on $dev); NCCL takes one index for all: re-apply the fabric addresses, and remove extra (e.g. link-local) IPv4 addresses from the fabric ports" >&2
    exit 78
  fi
  GID=$i
done
export NCCL_IB_GID_INDEX="$GID"
echo "sparkctl: NCCL_IB_GID_INDEX=$GID for rocep1s0f1,roceP2p1s0f1"

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
  ghcr.io/tensorfold/tensorfold-spark:4x-2026.10 \
  tensorfold serve --weights /srv/models/DeepSeek-V4.1-Flash-1017 --name dsv41-flash-tensorfold --tp 4 --world 4 --rank 3 --rendezvous 10.40.0.1:29500 --listen 0.0.0.0:8000 --ctx 1048576 --mem-fraction 0.85
