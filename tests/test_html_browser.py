"""The leaderboard and paper pages rendered in headless Chromium, checked on the live DOM: no table reaches
past the viewport (wide ones scroll in their own box), numeric cells stay on one line, every image loads.

Marked `browser`: `make test-browser` (a CI stage in .ci/run) installs Chromium when it is missing and sets
TIMBENCH_REQUIRE_CHROMIUM=1, which turns a missing browser into a failure instead of a skip.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[1]

# Runs in the page after load; writes its findings as JSON into <pre id="dom-checks"> for --dump-dom.
CHECKS = """
<script>
window.addEventListener('load', () => {
  const vw = document.documentElement.clientWidth;
  const out = {viewport: vw, page_scroll_width: document.documentElement.scrollWidth, tables: 0,
               overflowing: [], wrapped: [], images: 0, broken: []};
  document.querySelectorAll('table').forEach((t, i) => {
    out.tables += 1;
    const box = (t.closest('.scroll') || t).getBoundingClientRect();
    if (box.right > vw + 1) out.overflowing.push(i + ': right ' + Math.round(box.right));
  });
  document.querySelectorAll('td.num').forEach(td => {  // a wrapped text has one client rect per line
    const range = document.createRange(); range.selectNodeContents(td);
    const lines = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
    if (lines.size > 1 && out.wrapped.length < 5) out.wrapped.push(td.textContent);
  });
  document.querySelectorAll('img').forEach(img => {
    out.images += 1;
    if (!img.complete || img.naturalWidth === 0) out.broken.push(img.alt);
  });
  const pre = document.createElement('pre'); pre.id = 'dom-checks'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _render(page: Path, tmp_path: Path, width: int) -> dict:
    exe = _chromium()
    if exe is None:
        if os.environ.get("TIMBENCH_REQUIRE_CHROMIUM") == "1":
            pytest.fail("Chromium is required (TIMBENCH_REQUIRE_CHROMIUM=1) but not installed: make test-browser")
        pytest.skip("no Chromium here; `make test-browser` installs it and runs these tests")
    probe = tmp_path / page.name
    probe.write_text(page.read_text().replace("</body>", CHECKS + "</body>"))
    r = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},900",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    m = re.search(r'<pre id="dom-checks">(.*?)</pre>', r.stdout, re.S)
    assert m, f"the page's checks never ran (chromium exit {r.returncode}): {r.stderr[-1500:]}"
    return json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.parametrize(
    "page,width",
    [
        ("results/tracks/quick/leaderboard.html", 1280),
        ("results/paper/leaderboard.html", 1000),
        ("results/paper/paper.html", 1280),
    ],
)
def test_page_renders_without_overflow_and_with_every_image(page, width, tmp_path):
    checks = _render(REPO / page, tmp_path, width)
    assert checks["tables"] >= 1 and checks["images"] >= 1, checks
    assert checks["overflowing"] == [], checks
    assert checks["page_scroll_width"] <= checks["viewport"] + 1, checks  # no sideways scroll of the page
    assert checks["broken"] == [], checks
    assert checks["wrapped"] == [], checks
