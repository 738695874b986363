"""`python -m envforge.cli`: the `envforge` command without its console script (the service tests and
bench start servers this way, with the interpreter of the running process)."""

from envforge.cli import app

app()
