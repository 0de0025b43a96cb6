"""The edges: connections to RabbitMQ and Redis."""
