"""The trade domain: purchase requests, purchases, and their wire forms."""
