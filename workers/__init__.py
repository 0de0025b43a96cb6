"""Process entry points for the systemd fleet: one module per worker kind.

Each module exposes `build(settings, **options) -> Worker`. `aldebaran run KIND` runs
one worker; `aldebaran up` runs every worker of one machine in one process.
"""

WORKER_MODULES = {
    "engine": "workers.engine",
    "aggregator": "workers.aggregator",
    "books": "workers.books",
    "lookout": "workers.lookout",
    "channel": "workers.channel",
    "tracer": "workers.tracer",
}

# Per `mode`: the worker kinds that play the aggregator and the book-worker roles.
MODE_KINDS = {
    "engine": (None, "engine"),
    "per-order": ("aggregator", "books"),
}
