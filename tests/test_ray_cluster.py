"""The Ray backend on a real multi-node cluster on this machine, without a shared filesystem.

A head and an extra node are separate `ray start`s (own node ids, temp dirs,
object stores, loopback IPs; tests/raycluster.py). Cells need the custom
resource `extra`, which only the extra nodes have, so they never run on the
driver's node; the plug-in remedy file and the checkpoint exist only in the
driver's temp directory and are referred to by paths relative to it; the
plug-in refuses to run from there inside a Ray worker. Mid-cell, the extra
node is killed (every one of its processes, SIGKILL) and a replacement node
joins; later the driver itself is killed with SIGKILL and rerun with the same
command. The result must be byte-identical to the local backend's: metrics.jsonl,
eval.jsonl, summary.json, config.yaml and status.json of every cell; the final
checkpoint tensor by tensor (see `_same_state`); timing.jsonl and cell.json hold
wall times, so their steps and statuses are checked instead. One cell of the Ray directory is run by the local
backend's cell function first, so the directory mixes both backends.

Marked `ray_cluster` (its own CI stage). TIMBENCH_REQUIRE_RAY=1 turns a missing Ray into a failure.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from raycluster import Cluster

from timbench.grid.layout import load_cells, read_status
from timbench.grid.spec import load_grid
from timbench.model import PRESETS, Qwen3ForCausalLM, save_checkpoint
from timbench.runners.cell import run_cell
from timbench.runners.driver import run_grid
from timbench.runners.ship import CKPT, checkpoint_step

pytestmark = pytest.mark.ray_cluster

STEPS = 6
COMPARED = ("metrics.jsonl", "eval.jsonl", "summary.json", "config.yaml", "status.json")


def _same_state(a: Path, b: Path) -> None:
    """Two checkpoints hold the same keys, values and tensors, bit for bit (dtypes included).

    Their bytes may differ: pickle writes a string once and back-references it when the same object
    recurs, and a resumed run's optimizer keys come from torch.load, not the interned constants of
    a run that never stopped (measured: the only difference, at the first optimizer `step` key).
    """
    import torch

    def walk(x, y, path):
        assert type(x) is type(y), path
        if isinstance(x, dict):
            assert list(x) == list(y), path
            for k in x:
                walk(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}[{i}]")
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), path
        else:
            assert x == y, path

    walk(torch.load(a, weights_only=True), torch.load(b, weights_only=True), str(b))


PLUGIN = """
import os
from dataclasses import dataclass
from timbench.remedies import Remedy, finish, log_rho, param

if os.environ.get("TIMBENCH_TEST_NODE") and os.path.realpath(__file__).startswith({driver!r}):
    raise RuntimeError("a Ray worker imported the plug-in from the driver's directory")


@dataclass(frozen=True)
class ScaledParams:
    scale: float = param(0.5, "multiplier on every token")


class Scaled(Remedy):
    name = "scaled"
    doc = "Scale every token by a constant (a test plug-in that lives only in the driver's directory)."
    Params = ScaledParams

    def __call__(self, batch):
        w = log_rho(batch).exp() * 0 + self.params.scale
        return finish(batch, weights=w, extra={{"remedy/scaled_tokens": float(batch.mask.sum())}})
"""


@pytest.fixture(scope="module")
def ray_installed():
    if os.environ.get("TIMBENCH_REQUIRE_RAY") == "1":
        import ray  # noqa: F401 - must import
    else:
        pytest.importorskip("ray", reason="the Ray backend needs the optional extra timbench[ray]")


def _driver_dir(root: Path) -> Path:
    d = root / "driver"
    (d / "plug").mkdir(parents=True)
    (d / "plug" / "scaled.py").write_text(PLUGIN.format(driver=str(d.resolve())))
    save_checkpoint(Qwen3ForCausalLM(PRESETS["tiny-dense"], seed=2), d / "ckpt")
    doc = {
        "name": "rc",
        "base": {
            "model": "ckpt",
            "steps": STEPS,
            "prompts_per_step": 4,
            "group_size": 4,
            "mini_batches": 2,
            "eval_n": 16,
            "eval_every": 2,
            "checkpoint_every": 1,
        },
        # bf16-engine: a real mismatch on exact kernels, whose bytes are promised on any process and CPU
        # (the torch-kernel `production` cell's step 0 differed between this process and a worker on an AMD EPYC).
        "axes": {"condition": ["bf16-engine"], "remedy": ["plug/scaled.py:Scaled", "none"]},
    }
    (d / "g.yaml").write_text(yaml.safe_dump(doc))
    return d


def _wait(pred, timeout: float, what: str, proc=None):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = pred()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"driver exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _ckpt_step(out: Path, cid: str) -> int | None:
    p = out / "runs" / cid / CKPT
    return checkpoint_step(p.read_bytes()) if p.is_file() else None


def test_grid_on_a_multi_node_cluster_survives_a_node_and_a_driver_kill(ray_installed, tmp_path, monkeypatch):
    t_all = time.monotonic()
    drv = _driver_dir(tmp_path)
    monkeypatch.chdir(drv)  # relative model/remedy paths mean the driver's directory, for both backends
    grid = load_grid(drv / "g.yaml")
    local, out = tmp_path / "local", tmp_path / "ray"

    t0 = time.monotonic()
    final = run_grid(grid, local, workers=1, backend="local")
    local_s = time.monotonic() - t0
    assert all(s["status"] == "done" for s in final.values()), final
    cids = list(final)
    # The mixed directory: one cell by the local backend's cell function (in this process), the rest on Ray.
    cells = {c["id"]: c for c in load_cells(local)["cells"]}
    mixed = next(c for c in cids if "none" in c)
    assert run_cell(cells[mixed], str(out))["status"] == "done"
    on_ray = [c for c in cids if c != mixed]

    cluster = Cluster()
    t0 = time.monotonic()
    try:
        address = cluster.start_head()
        cluster.add_node("a", "127.0.0.2", {"extra": 1})
        startup_s = time.monotonic() - t0
        cmd = [
            str(Path(sys.executable).with_name("timbench")),
            "grid",
            "run",
            "g.yaml",
            "--out",
            str(out),
            "--backend",
            "ray",
            "--address",
            address,
            "--resources",
            '{"extra": 1}',
        ]
        env = {**cluster.env, "PYTHONUNBUFFERED": "1"}
        t0 = time.monotonic()
        log1 = open(tmp_path / "driver1.log", "w+")  # a file, not a pipe: an unread pipe would block the driver
        first = subprocess.Popen(cmd, cwd=drv, env=env, stdout=log1, stderr=subprocess.STDOUT, text=True)
        # 1. A node dies mid-cell, after the driver received a checkpoint of the cell running there.
        victim, s_kill = _wait(
            lambda: next(((c, s) for c in on_ray if (s := _ckpt_step(out, c)) is not None), None),
            300,
            "the first shipped checkpoint",
            first,
        )
        assert s_kill < STEPS
        assert cluster.kill_node("a") >= 2  # raylet, agents, the worker
        cluster.add_node("b", "127.0.0.3", {"extra": 1})
        # 2. The driver dies (SIGKILL) after the cell resumed on the new node and shipped a checkpoint there.
        _wait(
            lambda: (read_status(out, victim) or {}).get("attempts") == 2 and (_ckpt_step(out, victim) or 0) > s_kill,
            300,
            "a checkpoint from the replacement node",
            first,
        )
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        err1 = (tmp_path / "driver1.log").read_text()
        assert f"cell {victim}: lost on node" in err1 and "resuming from step" in err1, err1[-3000:]
        resumed_at = int(err1.split(f"cell {victim}: lost on node")[1].split("resuming from step ")[1].split()[0])
        assert resumed_at >= s_kill  # nothing lost but the steps since the last shipped checkpoint
        # 3. The same command again finishes the grid.
        second = subprocess.run(cmd, cwd=drv, env=env, capture_output=True, text=True, timeout=300)
        ray_s = time.monotonic() - t0
        assert second.returncode == 0, second.stderr[-3000:]
        assert f"grid rc: {len(cids)}/{len(cids)} cells done" in second.stdout
        # Cells trained in their node's own scratch: the victim's on node a is left by the node kill, and
        # one on node b by the driver kill (Ray SIGKILLs a dead driver's workers); finished attempts clean up.
        assert len(list(cluster.scratch("a").glob(f"timbench-{victim}-*/run/checkpoints/state.pt"))) == 1
        assert [p.name.startswith(f"timbench-{victim}-") for p in cluster.scratch("b").iterdir()] in ([], [True])
        assert not list(cluster.scratch("head").iterdir())
    finally:
        cluster.stop()
    assert cluster.pids() == []

    for cid in cids:
        a, b = local / "runs" / cid, out / "runs" / cid
        for name in COMPARED:
            assert (a / name).read_bytes() == (b / name).read_bytes(), (cid, name)
        _same_state(a / CKPT, b / CKPT)
        assert [json.loads(line)["step"] for line in (b / "timing.jsonl").read_text().splitlines()] == list(
            range(STEPS)
        )
        assert read_status(out, cid)["status"] == "done"
        # no temp file left by an atomic write (a run's .lock, the train lock, is not one)
        assert not [p for p in b.rglob(".*") if p.is_file() and p.name != ".lock"]
    assert (
        '"remedy/scaled_tokens"' in (out / "runs" / on_ray[0] / "metrics.jsonl").read_text()
        or '"remedy/scaled_tokens"' in (out / "runs" / on_ray[-1] / "metrics.jsonl").read_text()
    )
    assert read_status(out, victim)["attempts"] == 3  # node a, node b, node b again under the rerun driver
    print(
        f"\nwall: local grid {local_s:.1f}s, cluster start {startup_s:.1f}s "
        f"({', '.join(f'{k} {v:.1f}s' for k, v in cluster.start_s.items())}), ray runs {ray_s:.1f}s, "
        f"whole test {time.monotonic() - t_all:.1f}s"
    )
