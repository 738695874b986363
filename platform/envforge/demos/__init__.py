"""Demos: programs that show envforge working end to end (the learning demo, its task family, the
fleet demo). They sit above the library, beside the CLI and the Dagster assets that run them;
nothing in the library imports them."""
