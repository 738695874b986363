"""Project tooling run by `make lint` and the test suite (not part of the envforge package)."""
