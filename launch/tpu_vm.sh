#!/usr/bin/env bash
# Runs one training command on every worker of a Cloud TPU VM pod slice.
#   launch/tpu_vm.sh TPU_NAME ZONE configs/cpt.py:qwen3_30b_a3b gs://bucket/run [--config.x=y ...]
# Each worker runs launch/train.py with --config.dist.auto=true; jax.distributed.initialize()
# discovers the coordinator, process count and index from the TPU metadata. The repository must
# be present (same path) on every worker, e.g. cloned by a start-up script.
set -euo pipefail
TPU_NAME=${1:?tpu name}; ZONE=${2:?zone}; CONFIG=${3:?config}; WORKDIR=${4:?workdir}
shift 4
REPO=${REPO:-$HOME/lwm_jax}
CMD="cd $REPO && .venv/bin/python launch/train.py --config=$CONFIG --workdir=$WORKDIR \
--config.dist.auto=true $*"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$CMD"
