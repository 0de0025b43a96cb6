"""Process entry points for the systemd fleet: one module per worker kind.

Each module exposes `build(settings, **options) -> Worker`. `aldebaran run KIND` runs
one worker; `aldebaran up` runs every worker of one machine in one process.
"""

WORKER_MODULES = {
    "aggregator": "workers.aggregator",
    "books": "workers.books",
    "lookout": "workers.lookout",
    "channel": "workers.channel",
    "tracer": "workers.tracer",
}
