"""Delivery channels: one small sink module per `kind`, behind `base.Sink`."""
