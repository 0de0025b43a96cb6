"""Prometheus metrics of every worker, named and documented in one place."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)

EVENTS_CONSUMED = Counter("aldebaran_events_consumed_total", "Trade events decoded by aggregators", ["type"])
DEAD_LETTERED = Counter("aldebaran_messages_dead_lettered_total", "Messages sent to the dead-letter queue", ["reason"])
BOOKS_OPEN = Gauge("aldebaran_books_open", "Books currently held by this process")
BOOK_EVENTS = Counter("aldebaran_book_events_total", "Events offered to books, by outcome", ["outcome"])
EVENTS_HANDED_OVER = Counter("aldebaran_engine_events_handed_over_total",
                             "Events a partitioned engine handed to the engines owning their books")
CONFLICTING_DUPLICATES = Counter("aldebaran_conflicting_duplicates_total",
                                 "Events whose id a book had already counted with other content (the first copy wins)")
RULE_ERRORS = Counter("aldebaran_rule_errors_total",
                      "Events (or book closes) an application's rule raised on: the message is dead-lettered, "
                      "the others go on", ["app"])
ALERTS_FIRED = Counter("aldebaran_alerts_fired_total", "Alerts published to the alert exchange", ["kind"])
ALERTS_DEDUPLICATED = Counter("aldebaran_alerts_deduplicated_total", "Alerts suppressed as already sent")
ALERTS_RECOVERED = Counter("aldebaran_alerts_recovered_total",
                           "Per-order alerts found pending after a crash, by how they were settled (witnessed in "
                           "the book queue: not published again; published: no witness)", ["outcome"])
ALERTS_UNCONFIRMED = Counter("aldebaran_alerts_unconfirmed_total",
                             "Alerts whose publish the broker did not confirm (a nack, a lost connection): "
                             "their witness proves nothing, they are published again")
ALERTS_DELIVERED = Counter("aldebaran_alerts_delivered_total", "Alerts delivered to a channel's recipient", ["channel"])
DELIVERY_RETRIES = Counter("aldebaran_delivery_retries_total", "Failed delivery attempts that will be retried",
                           ["channel"])
DELIVERY_IN_DOUBT = Counter("aldebaran_delivery_in_doubt_total",
                            "At-most-once attempts found interrupted or ended unknown: listed, never re-sent",
                            ["channel"])
DELIVERY_DEAD_LETTERED = Counter("aldebaran_delivery_dead_lettered_total", "Alerts parked after the last attempt",
                                 ["channel"])
BATCH_EVENTS = Histogram("aldebaran_batch_events", "Events per consumed or published AMQP message", ["stage"],
                         buckets=BATCH_BUCKETS)
PROCESSING_LATENCY = Histogram(
    "aldebaran_processing_latency_seconds", "Time from ingest to a pipeline stage", ["stage"], buckets=LATENCY_BUCKETS
)
BROKER_RECONNECTS = Counter("aldebaran_broker_reconnects_total", "Reconnections to RabbitMQ", ["component"])
REDIS_NOT_REPLICATED = Counter("aldebaran_redis_not_replicated_total",
                               "Redis writes that fewer replicas than redis_min_replicas_acked acknowledged in time "
                               "(the step failed, its input stays unacked)")


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on `port` (0 disables it)."""
    if port:
        start_http_server(port, addr=host)

# Pressure (docs/backpressure.md)
CONNECTIONS_BLOCKED = Gauge("aldebaran_connections_blocked", "Connections the broker has blocked (memory/disk alarm)")
PUBLISH_NACKS = Counter("aldebaran_publish_nacks_total", "Publishes refused by the broker and retried", ["publisher"])
UNROUTABLE = Counter("aldebaran_publish_unroutable_total",
                     "Mandatory publishes returned by the broker (no queue to route to) and retried", ["publisher"])
INGEST_LAG = Gauge("aldebaran_ingest_lag_seconds", "Age of the newest event consumed (time behind the publishers)",
                   ["stage"])
DONE_MARKERS = Gauge("aldebaran_done_markers", "Closed books the engine remembers (late events are recognised)")
DONE_MARKERS_FORGOTTEN = Counter("aldebaran_done_markers_forgotten_total",
                                 "Done markers dropped before their retention because engine.done_max_markers "
                                 "was reached")
QUEUE_DEPTH = Gauge("aldebaran_queue_depth_messages", "Messages ready in a queue, sampled by its consumer", ["queue"])
