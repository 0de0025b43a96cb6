"""`aldebaran bench`: the side-by-side benchmark of the broker ceiling, naive, per-order and sharded modes."""
