#!/usr/bin/env bash
# One-command set-up, idempotent: a virtualenv with Aldebaran and its test extras, and a
# RabbitMQ (with the management and tracing plugins) and a Redis answering where the
# settings say. On Debian/Ubuntu as root it installs and starts what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

AMQP_HOST=${SETUP_AMQP_HOST:-127.0.0.1}
AMQP_PORT=${SETUP_AMQP_PORT:-5672}
REDIS_HOST=${SETUP_REDIS_HOST:-127.0.0.1}
REDIS_PORT=${SETUP_REDIS_PORT:-6379}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] %s\n' "$*" >&2; exit 1; }
answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
is_debian_root() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
APT_UPDATED=
apt_install() {
  is_debian_root || die "missing: $* — install it, or start the services with deploy/docker-compose.yml (docker compose -f deploy/docker-compose.yml up -d)"
  if [ -z "$APT_UPDATED" ]; then apt-get update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. Python environment. The distribution's interpreter comes first: Debian's python3.11 is
# one statically linked binary, built with profile-guided optimisation; on a box whose PATH
# found a --enable-shared build first (pyenv's default), Debian's drained 24-28 % more msgpack
# events/s, engine and hand-written consumer alike (docs/benchmarks.md, "The interpreter").
# PYTHON=... chooses another.
is_311() { command -v "$1" >/dev/null && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
if [ -z "${PYTHON:-}" ]; then
  for candidate in /usr/bin/python3.11 /usr/bin/python3 python3.11 python3; do
    if is_311 "$candidate"; then PYTHON=$candidate; break; fi
  done
fi
[ -n "${PYTHON:-}" ] && is_311 "$PYTHON" || die "Python >= 3.11 needed (none found; PYTHON=${PYTHON:-unset})"
if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then  # Debian ships venv's pip apart
    say "installing the venv module for $PYTHON"
    apt_install "python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
  fi
  say "creating .venv with $PYTHON"; "$PYTHON" -m venv .venv
else
  base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
  [ "$base" = "$(command -v "$PYTHON")" ] || say "note: .venv runs $base, not $PYTHON (rm -rf .venv to rebuild it)"
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  say "installing aldebaran with test extras into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  rm -f .venv/.installed-*; touch "$stamp"
fi
# `make lint` needs only the virtualenv.
if [ "${SETUP_VENV_ONLY:-0}" = 1 ]; then say "ready: .venv"; exit 0; fi

# 2. RabbitMQ
if ! answers "$AMQP_HOST" "$AMQP_PORT"; then
  if ! command -v rabbitmq-server >/dev/null; then say "installing rabbitmq-server"; apt_install rabbitmq-server; fi
  [ "$AMQP_HOST" = 127.0.0.1 ] || die "RabbitMQ does not answer at $AMQP_HOST:$AMQP_PORT"
  say "starting RabbitMQ"
  rabbitmq-server -detached
  for _ in $(seq 90); do answers "$AMQP_HOST" "$AMQP_PORT" && break; sleep 1; done
  answers "$AMQP_HOST" "$AMQP_PORT" || die "RabbitMQ did not start (see /var/log/rabbitmq)"
fi
if command -v rabbitmq-plugins >/dev/null && [ "$AMQP_HOST" = 127.0.0.1 ]; then
  rabbitmqctl await_startup >/dev/null 2>&1 || true
  if ! rabbitmq-plugins list -e -m 2>/dev/null | grep -q '^rabbitmq_tracing$' \
     || ! rabbitmq-plugins list -e -m 2>/dev/null | grep -q '^rabbitmq_management$'; then
    say "enabling rabbitmq_management and rabbitmq_tracing"
    rabbitmq-plugins enable rabbitmq_management rabbitmq_tracing >/dev/null
  fi
  for _ in $(seq 60); do answers 127.0.0.1 15672 && break; sleep 1; done
  answers 127.0.0.1 15672 || die "the RabbitMQ management API does not answer on 15672"
fi

# RabbitMQ's schedulers. On a machine of two cores or fewer the local broker shares them with
# the engine: one scheduler leaves the engine a core and saves the broker's threads from waking
# each other for every message. Paced at 100,000 events/s in 100-event messages, p99 publish->book
# fell from 25-63 ms to 17-21 ms, the drains unchanged (docs/benchmarks.md, "2026-12-07 night:
# one scheduler for the broker"). SETUP_RABBITMQ_SCHEDULERS=N chooses another count; `keep` leaves
# the broker alone.
# The running broker takes it at once; /etc/rabbitmq/rabbitmq-env.conf keeps it across restarts.
SCHEDULERS=${SETUP_RABBITMQ_SCHEDULERS:-$([ "$(nproc)" -le 2 ] && echo 1 || echo keep)}
if [ "$SCHEDULERS" != keep ] && [ "$AMQP_HOST" = 127.0.0.1 ] && is_debian_root && command -v rabbitmqctl >/dev/null; then
  bash deploy/rabbitmq/keep-schedulers.sh /etc/rabbitmq/rabbitmq-env.conf "$SCHEDULERS"  # refuses what is not a count
  online=$(rabbitmqctl eval 'erlang:system_info(schedulers_online).' 2>/dev/null || echo "?")
  if [ "$online" != "$SCHEDULERS" ]; then
    if rabbitmqctl eval "erlang:system_flag(schedulers_online, $SCHEDULERS)." >/dev/null 2>&1; then
      say "RabbitMQ: $SCHEDULERS scheduler(s) online (was $online)"
    else
      say "note: RabbitMQ keeps $online scheduler(s) online until it restarts"
    fi
  fi
fi

# 3. Redis
if ! answers "$REDIS_HOST" "$REDIS_PORT"; then
  if ! command -v redis-server >/dev/null; then say "installing redis-server"; apt_install redis-server; fi
  [ "$REDIS_HOST" = 127.0.0.1 ] || die "Redis does not answer at $REDIS_HOST:$REDIS_PORT"
  say "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT"
  for _ in $(seq 30); do answers "$REDIS_HOST" "$REDIS_PORT" && break; sleep 1; done
  answers "$REDIS_HOST" "$REDIS_PORT" || die "Redis did not start"
fi

# 4. Tools the audit and the test suite use
command -v java >/dev/null || { say "installing a Java runtime for Spark"; apt_install openjdk-17-jre-headless; }
if [ "${SETUP_TEST_TOOLS:-0}" = 1 ]; then
  # The audit JVM's classes, archived once per Java and PySpark build (~50 s the first time): the
  # suite's audits start ~4 s sooner (spark_analytics/class_archive.py), and it checks the archive.
  .venv/bin/python -m spark_analytics.class_archive || say "no class archive: audits start without it"
  command -v chromium >/dev/null || { say "installing Debian's chromium for the browser test"; apt_install chromium; }
  command -v systemd-analyze >/dev/null || { say "installing systemd for unit verification"; apt_install systemd; }
fi
say "ready: RabbitMQ $AMQP_HOST:$AMQP_PORT, Redis $REDIS_HOST:$REDIS_PORT, .venv"
