import exporters


def test_builtin_exporters():
    assert exporters.names() == ["csv", "json"]


def test_csv_export():
    assert exporters.get("csv")([{"a": 1, "b": 2}]) == "a,b\n1,2\n"


def test_lookup_ignores_case():
    assert exporters.get("CSV") is exporters.get("csv")
