"""Export rows of dicts in several formats; plugins add their own with `register`."""

import csv
import io
import json

_REGISTRY = {}


def register(name, exporter):
    _REGISTRY[name] = exporter


def names():
    return sorted(_REGISTRY)


def get(name):
    return _REGISTRY[name]


def _csv(rows):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _json(rows):
    return json.dumps(rows, sort_keys=True)


register("csv", _csv)
register("json", _json)
