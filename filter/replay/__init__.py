"""The replay surface: republish a dead-letter subscription's messages through the engine."""
