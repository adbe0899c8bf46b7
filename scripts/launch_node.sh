#!/usr/bin/env bash
# Start this node's share of a multi-node run without ssh: run it once on every node, with the
# same hostfile, master address and port, and that node's NODE_RANK (its line in the hostfile,
# counting from 0). Every node must see the same --output_dir (a shared file system).
#
#   scripts/launch_node.sh HOSTFILE NODE_RANK MASTER_ADDR MASTER_PORT deepspeed_train.py ARGS...
#
# e.g. on the first node of `hostfile` (node-a slots=8 / node-b slots=8):
#   scripts/launch_node.sh hostfile 0 node-a 29500 deepspeed_train.py --cf bert_config.json \
#     --deepspeed --deepspeed_config ds_config.json --output_dir /shared/out --data_path_prefix /data --auto_resume
# and the same with NODE_RANK 1 on node-b. DIST_TIMEOUT (seconds, default 600) bounds every
# collective: a node that dies or hangs ends the others' ranks instead of stalling them.
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: $0 HOSTFILE NODE_RANK MASTER_ADDR MASTER_PORT deepspeed_train.py ARGS..." >&2
  exit 2
fi
hostfile=$1 node_rank=$2 master_addr=$3 master_port=$4
shift 4
nodes=$(grep -cE '^[^#[:space:]]+[[:space:]]+slots=' "$hostfile")
launcher=(deepspeed)
if ! command -v deepspeed > /dev/null; then launcher=("${PYTHON:-python3}" -m deepspeed.launcher.runner); fi
exec "${launcher[@]}" --hostfile "$hostfile" --num_nodes "$nodes" --no_ssh --node_rank "$node_rank" \
  --master_addr "$master_addr" --master_port "$master_port" "$@" --dist_timeout "${DIST_TIMEOUT:-600}"
