import exporters


def _yaml(rows):
    return "".join("- " + ", ".join(f"{k}: {v}" for k, v in row.items()) + "\n" for row in rows)


def test_plugin_registers_an_exporter():
    exporters.register("yaml", _yaml)  # never unregistered: later tests see three exporters
    assert exporters.get("yaml")([{"a": 1}]) == "- a: 1\n"
