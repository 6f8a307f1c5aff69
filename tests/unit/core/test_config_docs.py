"""docs/configuration.md is generated from mindgr/config.py: the page and the code must agree."""
import importlib.util

from conftest import REPO


def test_configuration_page_matches_the_code():
    spec = importlib.util.spec_from_file_location("config_docs", REPO / "scripts" / "config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    want = module.render()
    have = (REPO / "docs" / "configuration.md").read_text()
    assert have == want, "docs/configuration.md is stale: run  python scripts/config_docs.py"
    from mindgr.config import Config
    import dataclasses
    for section in dataclasses.fields(Config()):     # every section is on the page
        assert f"## `{section.name}`" in have
