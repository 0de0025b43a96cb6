"""The AweQ-style pull API (and, later, the dashboard) served by `aldebaran api`."""
