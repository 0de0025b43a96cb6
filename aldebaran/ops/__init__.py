"""Operating Aldebaran: `aldebaran stats` and `aldebaran health` (issue 8)."""
