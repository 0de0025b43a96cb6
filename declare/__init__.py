"""The broker topology as data (CONTRACT §2) and the `aldebaran declare` command."""
