"""A tiny TTL cache."""
