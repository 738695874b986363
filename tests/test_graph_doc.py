"""docs/pipeline.md shows the asset graph the code defines (regenerate: python -m assets.graph_doc)."""

from assets.definitions import defs
from assets.graph_doc import embedded, mermaid
from tests.conftest import REPO


def test_docs_show_the_current_asset_graph():
    committed = embedded((REPO / "docs" / "pipeline.md").read_text())
    assert committed == mermaid(defs), "docs/pipeline.md is stale: paste the output of python -m assets.graph_doc"


def test_every_asset_has_group_owner_kind_and_description():
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        spec = defs.get_assets_def(key).specs_by_key[key]
        assert spec.group_name and spec.group_name != "default", key
        assert spec.owners and spec.kinds and spec.description, key
