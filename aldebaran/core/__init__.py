"""The reusable core: rules, books, routing and the alert outbox, knowing nothing of trades."""
