#!/bin/sh
# Rendered by sparkctl 0.1.0 for spark-a: profile tiny-llamacpp, llamacpp llama-cpp-python-0.3,
# replica 0, rank 0 of 1. `sparkctl up` rewrites this file.
set -eu
ENV_FILE=/etc/sparkctl/engine.env

# The env file's values are quoted for sh: sourcing it sets them and runs nothing.
set -a
# The env file is rendered beside this script (a per-node path shellcheck cannot follow).
# shellcheck source=/dev/null
. "$ENV_FILE"
set +a

exec python3 -m llama_cpp.server --model /srv/models/tiny-llama/tiny-llama.gguf --model_alias tiny-llama --host 0.0.0.0 --port 8080 --n_ctx 512 --interrupt_requests False
