#!/bin/sh
# Rendered by sparkctl 0.1.0 for spark-a: profile llamacpp-1box, llamacpp b6500,
# replica 0, rank 0 of 1. `sparkctl up` rewrites this file.
set -eu
ENV_FILE=/etc/sparkctl/engine.env

# The env file's values are quoted for sh: sourcing it sets them and runs nothing.
set -a
# The env file is rendered beside this script (a per-node path shellcheck cannot follow).
# shellcheck source=/dev/null
. "$ENV_FILE"
set +a

exec llama-server --model /srv/models/DeepSeek-V4-Flash-0731-Q2_K.gguf --alias deepseek-v4-flash-gguf --host 0.0.0.0 --port 8080 --ctx-size 131072 --kv-unified --parallel 8 --n-gpu-layers 999
