"""tools/imports_first.py, run by `make lint`, finds an import placed below
a module's definitions to dodge a circle of imports (as jobs/models.py once
imported the features' models on its last lines)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("imports_first", ROOT / "tools" / "imports_first.py")
imports_first = importlib.util.module_from_spec(spec)
spec.loader.exec_module(imports_first)


def test_it_finds_an_import_below_the_definitions(tmp_path):
    module = tmp_path / "models.py"
    module.write_text('"""A module."""\nimport os\n\n\nclass Job:\n    pass\n\n\n'
                      "from jobs.metrics.models import MetricPoint  # noqa: E402, F401\n")
    assert imports_first.late_imports(module) == [9]


def test_imports_above_and_inside_definitions_are_fine(tmp_path):
    module = tmp_path / "views.py"
    module.write_text("import os\nfrom pathlib import Path\n\nX = 1\n\n\ndef f():\n"
                      "    import json\n    return json\n")
    assert imports_first.late_imports(module) == []


def test_the_product_has_none():
    assert imports_first.main(ROOT) == 0
