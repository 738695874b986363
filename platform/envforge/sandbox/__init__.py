"""Sandboxes: Docker images for tasks and isolated, quota-bound containers to act in."""
