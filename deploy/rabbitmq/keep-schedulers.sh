#!/usr/bin/env bash
# keep-schedulers.sh ENV_CONF COUNT: the broker runs COUNT schedulers after its restarts.
#
# Writes `SERVER_ADDITIONAL_ERL_ARGS="+S COUNT:COUNT"` into RabbitMQ's environment file
# (/etc/rabbitmq/rabbitmq-env.conf), replacing the line it wrote before; an operator's own
# SERVER_ADDITIONAL_ERL_ARGS is left as it is, with a note when it holds no +S. Why one
# scheduler on a machine shared with the engine: docs/operations.md.
set -euo pipefail
conf=$1 count=$2
[[ "$count" =~ ^[1-9][0-9]*$ ]] || { echo "[setup] a scheduler count is a positive integer, not $count" >&2; exit 2; }
mark="# set by aldebaran's deploy/setup.sh"
theirs=$(grep -v -F "$mark" "$conf" 2>/dev/null | grep -E '^ *(export +)?SERVER_ADDITIONAL_ERL_ARGS=' || true)
if [ -n "$theirs" ]; then
  grep -q -- '+S ' <<<"$theirs" \
    || echo "[setup] note: $conf sets SERVER_ADDITIONAL_ERL_ARGS without +S: after a restart the broker runs its default schedulers"
  exit 0
fi
{ grep -v -F "$mark" "$conf" 2>/dev/null || true
  echo "SERVER_ADDITIONAL_ERL_ARGS=\"+S $count:$count\"  $mark"; } > "$conf.new"
mv "$conf.new" "$conf"
