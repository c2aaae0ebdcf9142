"""Source text of the plug-in remedies the tests write to files (a plug-in is loaded from a file, by path)."""

HEADER = """
import torch
from timbench.remedies import Remedy, finish, log_rho
"""

HALVE = """
class Halve(Remedy):
    name = "halve"
    doc = "weights 0.5"
    def __call__(self, batch):
        return finish(batch, weights=torch.full_like(log_rho(batch), 0.5), extra={"halve/scale": 0.5})
"""
"""Every token's weight 0.5, and a metric of its own (`halve/scale`)."""


def readme_plugin(name: str) -> str:
    """The ```python block of docs/guides/remedy.md that starts with `# NAME` (a documented plug-in, run as written)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "remedy.md").read_text()
    found = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith(f"# {name}")]
    assert len(found) == 1, f"docs/guides/remedy.md has {len(found)} python blocks starting with '# {name}'"
    return found[0]
