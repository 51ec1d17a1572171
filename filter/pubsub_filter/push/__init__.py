"""The push surface: an ASGI app for Pub/Sub push subscriptions, its auth and its server."""
