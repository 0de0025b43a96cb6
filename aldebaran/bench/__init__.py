"""`aldebaran bench`: the engine beside the broker ceiling, a hand-written consumer and Bytewax."""
