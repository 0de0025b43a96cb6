"""Shared test support: real services, per-test isolation, process drivers."""
