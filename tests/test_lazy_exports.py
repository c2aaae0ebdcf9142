"""Every name a package exports lazily resolves (a module move must carry its lazy exports along: the plug-in API's
`from timbench.remedies import log_rho, k3, fexp` once pointed at a module that had moved)."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.unit

PACKAGES = ["timbench.remedies", "timbench.gate", "timbench.rl", "timbench.grid", "timbench.diagnose"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_lazy_export_resolves(name):
    pkg = importlib.import_module(name)
    exports = getattr(pkg, "_EXPORTS", None)
    assert exports, f"{name} has no _EXPORTS table"
    for names in exports.values():
        for attr in names:
            assert getattr(pkg, attr) is not None, f"{name}.{attr}"
