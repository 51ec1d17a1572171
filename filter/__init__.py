"""pubsub-filter: forward a Pub/Sub message downstream only when its content changed."""

__version__ = "0.1.0"
