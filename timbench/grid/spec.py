"""Grid spec: the axes of a controlled experiment and their expansion into cells (one RL run each).

A grid file names the values of each axis (task x model x condition x remedy x
mode x algorithm x seed), RunConfig overrides shared by every cell (`base`),
combinations to leave out (`exclude`) and the condition table to read. `expand`
turns it into cells in a fixed order, builds and validates each cell's full
RunConfig at plan time (a bad cell fails before anything runs, naming the cell),
and maps every cell to its zero-mismatch reference cell.

    name: quick
    base: {steps: 200, eval_every: 20}
    axes: {condition: [baseline, bf16-engine], remedy: [none, tis_token], seed: [0, 1]}
    exclude: [{condition: baseline, remedy: tis_token}]

A remedy axis value may also name an entry of `remedy_variants`: a label for a remedy with parameter
overrides and RunConfig keys of its own, so one grid compares a remedy's variants side by side
(the paper grid: K1 vs K3 criterion, rejection on rho vs on the PPO ratio, a tightened PPO clip):

    remedy_variants:
      rs_k1: {remedy: tis_token+seq_rs, remedy_args: {divergence: k1, threshold: 0.03}}
      clip_0.05: {remedy: none, eps_low: 0.05, eps_high: 0.05}
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..remedies.identity import is_file_spec, remedy_identity
from ..rl.config import RunConfig, from_dict
from ..util.readfile import read_yaml
from ..util.shipped import default_checkpoint
from .conditions import Condition, load_conditions, parse_conditions
from .endpoint import check_endpoint

SHIPPED_CONDITIONS = Path(__file__).with_name("conditions.yaml")
"""The condition table shipped inside the package (package data): every grid's default."""
DEFAULT_CONDITIONS = "shipped"
"""`conditions_file` value (and default) naming SHIPPED_CONDITIONS."""


@dataclass
class Axes:
    """The values each axis takes; a grid is their cartesian product (minus `exclude`)."""

    task: list = field(default_factory=lambda: ["add-4d-v1"])
    """Task names (RunConfig.task)."""
    model: list = field(default_factory=lambda: ["tiny-dense"])
    """Model preset names (RunConfig.preset; with base.model=default, picks the shipped warm start)."""
    condition: list = field(default_factory=lambda: ["baseline"])
    """Condition names from the condition table (set RunConfig.engine and RunConfig.trainer)."""
    remedy: list = field(default_factory=lambda: ["none"])
    """Remedy specs (RunConfig.remedy); a plug-in file `path.py:Class` shows as `name@sha8` (remedies.identity)."""
    mode: list = field(default_factory=lambda: ["recompute"])
    """Handling modes, recompute | bypass (RunConfig.mode)."""
    algorithm: list = field(default_factory=lambda: ["grpo"])
    """RL algorithms (RunConfig.algorithm)."""
    seed: list = field(default_factory=lambda: [0])
    """Seeds (RunConfig.seed)."""


AXES = tuple(f.name for f in dataclasses.fields(Axes))
# RunConfig fields an axis sets; `base` may not set them too (one source of truth per value).
_AXIS_OWNED = {
    "task": "task",
    "preset": "model",
    "remedy": "remedy",
    "mode": "mode",
    "algorithm": "algorithm",
    "seed": "seed",
    "engine": "condition",
    "trainer": "condition",
}
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))


@dataclass
class GridSpec:
    """A grid of RL runs: axes, shared overrides, exclusions and the condition table."""

    name: str
    """Grid name (results go to results/<name> by convention); written to cells.json."""
    base: dict = field(default_factory=dict)
    """RunConfig overrides applied to every cell (not the axis-owned keys task, preset, engine, ...)."""
    axes: Axes = field(default_factory=Axes)
    """Values of each axis; an axis left out has its one default value."""
    exclude: list = field(default_factory=list)
    """Partial axis dicts; a cell matching every key of one entry is dropped (a value may be a list: any of)."""
    conditions_file: str | None = DEFAULT_CONDITIONS
    """Condition table: `shipped` (timbench/grid/conditions.yaml), or a path relative to the grid file's
    directory or the working directory; null = inline only."""
    conditions: dict = field(default_factory=dict)
    """Condition table after loading: the file's entries, overridden by inline `conditions:` entries."""
    reference: str = "baseline"
    """Name of the zero-mismatch condition (kind reference) every other cell is compared with."""
    collapse: dict = field(default_factory=dict)
    """Collapse-rule overrides, passed through to cells.json untouched (read by `timbench grid report`)."""
    workers: int | None = None
    """Default parallel cells for `timbench grid run` (None = os.cpu_count())."""
    remedy_variants: dict = field(default_factory=dict)
    """Remedy-axis labels -> {remedy: NAME, remedy_args: {...}, other RunConfig keys}: a remedy with its own
    parameters and config (e.g. PPO clip eps) under one label; the label is what the axis, ids and reports show."""
    endpoint: str | None = None
    """The pre-registered primary endpoint (timbench.grid.endpoint: final | last3 | last-half | auc); None: the
    reports' default (last-half). Written to cells.json and the fingerprint only when declared."""

    def to_dict(self) -> dict:
        """The resolved spec: self-contained (conditions inline, no file), so it reloads to the same cells."""
        d = {
            "name": self.name,
            "base": dict(self.base),
            "axes": dataclasses.asdict(self.axes),
            "exclude": [dict(e) for e in self.exclude],
            "conditions_file": None,
            "conditions": {
                n: {k: v for k, v in c.to_dict().items() if k != "name"} for n, c in self.conditions.items()
            },
            "reference": self.reference,
            "collapse": dict(self.collapse),
            "workers": self.workers,
        }
        if self.remedy_variants:  # only when used, so grids without variants keep their fingerprint
            d["remedy_variants"] = {k: dict(v) for k, v in self.remedy_variants.items()}
        if self.endpoint is not None:  # likewise: only when declared
            d["endpoint"] = self.endpoint
        return d


@dataclass
class Cell:
    """One RL run of the grid."""

    id: str
    """Readable, filesystem-safe id: {task}.{model}.{condition}.{remedy}.{mode}.{algorithm}.s{seed}."""
    axes: dict
    """The cell's value on every axis."""
    condition: Condition
    """The resolved condition."""
    reference: str | None
    """Id of the zero-mismatch cell with the same task/model/algorithm/seed; None for reference cells."""
    config: dict
    """Full RunConfig dict for `timbench.rl.loop.run`."""

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "axes": dict(self.axes),
            "condition": self.condition.to_dict(),
            "reference": self.reference,
            "config": self.config,
        }


_TOP = tuple(f.name for f in dataclasses.fields(GridSpec))


def _axis_values(name: str, raw, source: str) -> list:
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise ValueError(f"{source}: axes.{name} is empty; give at least one value")
    out = []
    for v in values:
        if name == "seed":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{source}: axes.seed values are integers >= 0, got {v!r}")
        elif not isinstance(v, str) or not v:
            raise ValueError(f"{source}: axes.{name} values are non-empty strings, got {v!r}")
        out.append(v)
    dup = sorted({str(v) for v in out if out.count(v) > 1})
    if dup:
        raise ValueError(f"{source}: axes.{name} lists {dup} more than once")
    return out


def _remedy_variants(raw, source: str) -> dict:
    """Validate `remedy_variants`: label -> {remedy, remedy_args, non-axis RunConfig keys}."""
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: 'remedy_variants' must be a mapping of label -> {{remedy: NAME, ...}}")
    allowed = ["remedy"] + [f for f in _RUN_FIELDS if f not in _AXIS_OWNED]
    out = {}
    for label, v in raw.items():
        where = f"{source}: remedy_variants.{label}"
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_.+-]+", label):
            raise ValueError(f"{source}: remedy_variants label {label!r} must be a string of [A-Za-z0-9_.+-]")
        if not isinstance(v, dict) or not isinstance(v.get("remedy"), str) or not v["remedy"]:
            raise ValueError(
                f"{where} must be a mapping with a 'remedy' name, e.g. {{remedy: tis_token, remedy_args: {{C: 3.0}}}}"
            )
        bad = sorted(set(map(str, v)) - set(allowed))
        if bad:
            owner = f"; {bad[0]!r} is owned by axis {_AXIS_OWNED[bad[0]]!r}" if bad[0] in _AXIS_OWNED else ""
            raise ValueError(f"{where}: unknown key(s) {bad}{owner}; valid: {', '.join(allowed)}")
        out[label] = dict(v)
    return out


def _resolve_table(value, grid_dir: Path) -> Path:
    if value == DEFAULT_CONDITIONS:
        return SHIPPED_CONDITIONS
    p = Path(value)
    if p.is_absolute():
        return p
    tried = [grid_dir / p, Path.cwd() / p]
    for cand in tried:
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"conditions_file {value!r} not found (tried {', '.join(map(str, tried))})")


def parse_grid(doc: dict, source: str = "grid", grid_dir: Path | None = None) -> GridSpec:
    """Validate a grid mapping (as read from YAML) into a GridSpec; each problem is a one-line error."""
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: a grid spec is a mapping with keys {', '.join(_TOP)}")
    unknown = sorted(set(map(str, doc)) - set(_TOP))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; valid: {', '.join(_TOP)}")
    name = doc.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise ValueError(f"{source}: 'name' must be a filesystem-safe string ([A-Za-z0-9_.-]), got {name!r}")
    for key in ("base", "axes", "collapse", "conditions"):
        if not isinstance(doc.get(key) or {}, dict):
            raise ValueError(f"{source}: {key!r} must be a mapping")
    base = dict(doc.get("base") or {})
    for k in base:
        if k in _AXIS_OWNED:
            raise ValueError(
                f"{source}: base sets {k!r}, which axis {_AXIS_OWNED[k]!r} owns; use axes.{_AXIS_OWNED[k]} instead"
            )
        if k not in _RUN_FIELDS:
            raise ValueError(
                f"{source}: base: unknown config key {k!r}; valid: "
                + ", ".join(f for f in _RUN_FIELDS if f not in _AXIS_OWNED)
            )
    axes_raw = doc.get("axes") or {}
    bad = sorted(set(map(str, axes_raw)) - set(AXES))
    if bad:
        raise ValueError(f"{source}: unknown axis {bad[0]!r}; valid axes: {', '.join(AXES)}")
    axes = Axes(**{k: _axis_values(k, v, source) for k, v in axes_raw.items()})

    table_file = doc.get("conditions_file", DEFAULT_CONDITIONS)
    if table_file is not None and not isinstance(table_file, str):
        raise ValueError(f"{source}: 'conditions_file' must be a path string or null, got {table_file!r}")
    table = load_conditions(_resolve_table(table_file, grid_dir or Path.cwd())) if table_file else {}
    table = {**table, **parse_conditions(doc.get("conditions"), f"{source}: inline")}
    reference = doc.get("reference", "baseline")
    if reference not in table or table[reference].kind != "reference":
        refs = [n for n, c in table.items() if c.kind == "reference"]
        raise ValueError(
            f"{source}: reference {reference!r} is not a condition of kind reference; "
            f"valid: {', '.join(refs) or 'none in the table'}"
        )
    for c in axes.condition:
        if c not in table:
            raise ValueError(f"{source}: axes.condition: unknown condition {c!r}; valid: {', '.join(table)}")

    exclude = doc.get("exclude") or []
    if not isinstance(exclude, list):
        raise ValueError(f"{source}: 'exclude' must be a list of partial axis mappings")
    for i, entry in enumerate(exclude):
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"{source}: exclude[{i}] must be a non-empty mapping of axis -> value(s)")
        for k, v in entry.items():
            if k not in AXES:
                raise ValueError(f"{source}: exclude[{i}]: unknown axis {k!r}; valid axes: {', '.join(AXES)}")
            for one in v if isinstance(v, list) else [v]:
                if one not in getattr(axes, k):  # a typo here would silently exclude nothing
                    raise ValueError(
                        f"{source}: exclude[{i}]: {k}={one!r} is not a value of axes.{k} {getattr(axes, k)}"
                    )
    workers = doc.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"{source}: 'workers' must be an integer >= 1, got {workers!r}")
    variants = _remedy_variants(doc.get("remedy_variants") or {}, source)
    endpoint = doc.get("endpoint")
    if endpoint is not None:
        check_endpoint(endpoint, f"{source}: endpoint")
    return GridSpec(
        name=name,
        base=base,
        axes=axes,
        exclude=[dict(e) for e in exclude],
        conditions_file=table_file,
        conditions=table,
        reference=reference,
        collapse=dict(doc.get("collapse") or {}),
        workers=workers,
        remedy_variants=variants,
        endpoint=endpoint,
    )


def load_grid(path: str | Path) -> GridSpec:
    """Read and validate a grid YAML file."""
    p = Path(path)
    return parse_grid(read_yaml(p, "grid file"), str(p), p.resolve().parent)


def file_plugins(grid: GridSpec) -> list[str]:
    """The plug-in remedy files (`path.py:Class`) a grid names, on its remedy axis or in its variants: code that
    `grid run` imports and runs with the caller's rights."""
    specs = list(grid.axes.remedy) + [v["remedy"] for v in grid.remedy_variants.values()]
    return sorted({s for s in specs if is_file_spec(s)})


def from_results_dir(path: str | Path) -> bool:
    """Whether a grid file is a results directory's copy (a `cells.json` lies beside it: `grid run` wrote both)."""
    return (Path(path).resolve().parent / "cells.json").is_file()


def _safe(value) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(value)).strip("-") or "x"


def cell_id(axes: dict) -> str:
    return ".".join(_safe(axes[k]) for k in AXES[:-1]) + f".s{int(axes['seed'])}"


def _remedy_label(spec: str, grid_name: str) -> str:
    """The remedy axis value cells, ids and reports show: remedies.identity.remedy_identity (one-line errors)."""
    try:
        return remedy_identity(spec)
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"grid {grid_name}: axes.remedy {spec!r}: {e}") from None


def _excluded(axes: dict, exclude: list[dict]) -> bool:
    return any(all(axes[k] in (v if isinstance(v, list) else [v]) for k, v in e.items()) for e in exclude)


def _checkpoint_problem(cfg: RunConfig) -> str | None:
    """Plan-time check that the warm start exists (a missing one would fail every step of the run)."""
    from ..model import PRESETS  # deferred: tokenizers is heavy

    if cfg.preset not in PRESETS:
        return f"unknown model preset {cfg.preset!r}; valid: {', '.join(PRESETS)}"
    if cfg.model == "default":
        try:
            default_checkpoint(cfg.task, cfg.preset)
        except FileNotFoundError as e:
            return str(e)
    elif not (Path(cfg.model) / "config.json").is_file():
        return f"model {cfg.model!r} is not a checkpoint directory (no config.json)"
    return None


def expand(grid: GridSpec) -> list[Cell]:
    """All cells of the grid in axis order (task outermost, seed innermost), minus exclusions."""
    cells: list[Cell] = []
    seen: dict[str, dict] = {}
    labels: dict[str, str] = {}
    for values in itertools.product(*(getattr(grid.axes, k) for k in AXES)):
        axes = dict(zip(AXES, values))
        if _excluded(axes, grid.exclude):
            continue
        spec = axes["remedy"]
        if spec not in grid.remedy_variants:  # a plug-in file is known by name@hash, not by where it lies
            axes["remedy"] = labels.setdefault(spec, _remedy_label(spec, grid.name))
        cid = cell_id(axes)
        if cid in seen:
            raise ValueError(
                f"grid {grid.name}: cells {seen[cid]} and {axes} both get id {cid!r}; rename an axis value"
            )
        seen[cid] = axes
        cond = grid.conditions[axes["condition"]]
        variant = grid.remedy_variants.get(spec, {"remedy": spec})
        raw = {
            "threads": 1,
            **grid.base,
            **variant,
            "task": axes["task"],
            "preset": axes["model"],
            "engine": cond.engine_spec,
            "trainer": cond.trainer_spec,
            "mode": axes["mode"],
            "algorithm": axes["algorithm"],
            "seed": axes["seed"],
        }
        try:
            cfg = from_dict(raw, f"cell {cid}")
        except (ValueError, KeyError) as e:
            msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
            raise ValueError(msg if msg.startswith(f"cell {cid}") else f"cell {cid}: {msg}") from None
        problem = _checkpoint_problem(cfg)
        if problem:
            raise ValueError(f"cell {cid}: {problem}")
        cells.append(Cell(cid, axes, cond, None, cfg.to_dict()))
    if not cells:
        raise ValueError(f"grid {grid.name}: every cell is excluded")
    _link_references(cells, grid.reference)
    return cells


def _link_references(cells: list[Cell], reference: str) -> None:
    """Point each cell at the reference cell of its (task, model, algorithm, seed), in place."""
    best: dict[tuple, tuple] = {}
    for i, c in enumerate(cells):
        if c.axes["condition"] != reference:
            continue
        key = tuple(c.axes[k] for k in ("task", "model", "algorithm", "seed"))
        rank = (c.axes["remedy"] != "none", c.axes["mode"] != "recompute", i)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, c.id)
    for c in cells:
        if c.axes["condition"] != reference:
            hit = best.get(tuple(c.axes[k] for k in ("task", "model", "algorithm", "seed")))
            c.reference = hit[1] if hit else None
