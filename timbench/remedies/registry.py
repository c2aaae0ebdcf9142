"""The remedy registry and plug-in loader: one dict of built-ins, one function that resolves a spec.

A spec is a registered name (`tis_token`), a verl / TRL vocabulary name (`verl` with verl's keys as
parameters, `verl:decoupled_geo_rs`, `trl:sequence_mask`: timbench.remedies.verl / .trl), an installed
entry point in the group `timbench.remedies`, `pkg.module:ClassName`, or `path/to/file.py:ClassName`. Every failure is a
one-line ValueError or FileNotFoundError that names what is wrong and what is valid.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from ..spec.keys import SPEC_KEYS, parse_spec
from ..util.registry import Registry
from .base import REPLAY_MODES, Remedy, describe_params
from .builtin import BUILTINS
from .deadline import PluginError
from .direction import DIRECTION_REMEDIES
from .identity import is_file_spec
from .rounding import ROUNDING_REMEDIES
from .support import SUPPORT_REMEDIES
from .trl import TRL_REMEDIES
from .verl import VERL_REMEDIES, Verl

ENTRY_POINT_GROUP = "timbench.remedies"

REMEDIES: Registry[type[Remedy]] = Registry(
    "remedy",
    {cls.name: cls for cls in (*BUILTINS, *DIRECTION_REMEDIES, *ROUNDING_REMEDIES, *SUPPORT_REMEDIES)},
    group=ENTRY_POINT_GROUP,
)
"""Built-in remedies by name; third-party ones come from the entry-point group (`_entry_points`)."""

VOCABULARY: dict[str, type[Remedy]] = {"verl": Verl, **VERL_REMEDIES, **TRL_REMEDIES}
"""verl's and TRL's corrections by their own names (checked before MODULE:CLASS, so `verl:x` is never a module)."""
VOCAB_PREFIXES = ("verl:", "trl:")


def _entry_points() -> dict:
    # Looked up through the module attribute at call time, so tests (and tools) can substitute it.
    return REMEDIES.load_entry_points()


def _valid_specs() -> str:
    return (
        f"registered: {', '.join(REMEDIES)}; verl, verl:<preset>, trl:<mode> (timbench remedies list); "
        f"or an entry point in group {ENTRY_POINT_GROUP}, "
        "pkg.module:ClassName or path/to/file.py:ClassName"
    )


def _import_file(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"remedy file {path} does not exist")
    resolved = path.resolve()
    # A name unique per file, so two plug-in files with the same stem do not replace each other.
    mod_name = f"timbench_remedy_plugin_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"remedy file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses look their module up here while the file executes
    try:
        spec.loader.exec_module(module)
    except (ImportError, SyntaxError) as e:  # a missing dependency or not Python: the file cannot be used as given
        sys.modules.pop(mod_name, None)
        raise ValueError(f"remedy file {path} failed to import: {type(e).__name__}: {e}") from None
    except (Exception, SystemExit) as e:  # the plug-in's own code raised (OSError, KeyError ...): not the input's
        sys.modules.pop(mod_name, None)
        raise _plugin_error(f"remedy file {path}: importing it", e) from e
    return module


def _plugin_error(what: str, e: BaseException) -> PluginError:
    msg = " ".join(str(e).split())
    return PluginError(
        f"{what} raised {type(e).__name__}" + (f": {msg}" if msg else "") + " (the plug-in's error, not the command's)"
    )


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ValueError(f"remedy module {name!r} cannot be imported: {e}") from None


def _remedy_classes(module) -> list[str]:
    return sorted(
        k for k, v in vars(module).items() if isinstance(v, type) and issubclass(v, Remedy) and v is not Remedy
    )


def _class_from(spec: str):
    target, _, cls_name = spec.rpartition(":")
    if not target or not cls_name:
        raise ValueError(f"remedy {spec!r} is not MODULE:CLASS or FILE.py:CLASS; {_valid_specs()}")
    module = _import_file(Path(target)) if is_file_spec(spec) else _import_module(target)
    if not hasattr(module, cls_name):
        found = _remedy_classes(module)
        raise ValueError(
            f"remedy {spec!r}: {target} has no class {cls_name!r}; remedies defined there: "
            f"{', '.join(found) or '(none)'}"
        )
    return getattr(module, cls_name)


def resolve(spec: str) -> type[Remedy]:
    """The Remedy subclass a spec names (not yet instantiated)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"remedy must be a non-empty string, got {spec!r}; {_valid_specs()}")
    spec = spec.strip()
    if spec in REMEDIES:
        return REMEDIES[spec]
    if spec in VOCABULARY:
        return VOCABULARY[spec]
    if spec.startswith(VOCAB_PREFIXES):
        prefix = spec.partition(":")[0] + ":"
        names = [n.removeprefix(prefix) for n in VOCABULARY if n.startswith(prefix)]
        close = difflib.get_close_matches(spec.removeprefix(prefix), names, n=1)
        hint = f"did you mean {prefix}{close[0]}? " if close else ""
        raise ValueError(f"unknown {prefix[:-1]} remedy {spec!r}; {hint}valid: {prefix}{{{', '.join(names)}}}")
    if ":" in spec:
        obj = _class_from(spec)
    else:
        if spec.endswith(".py"):  # a plug-in file named without its class: say which classes it defines
            found = _remedy_classes(_import_file(Path(spec)))
            raise ValueError(
                f"remedy {spec!r}: a file plug-in is named FILE.py:CLASS; remedies defined there: "
                f"{', '.join(f'{spec}:{c}' for c in found) or '(none)'}"
            )
        eps = _entry_points()
        if spec not in eps:
            close = difflib.get_close_matches(spec, [*REMEDIES, *VOCABULARY, *eps], n=3)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ValueError(f"unknown remedy {spec!r}; {hint}{_valid_specs()}")
        try:
            obj = eps[spec].load()
        except Exception as e:
            raise ValueError(f"remedy entry point {spec!r} failed to load: {type(e).__name__}: {e}") from None
    _check_class(obj, spec)
    return obj


def _check_class(obj, spec: str) -> None:
    if not (isinstance(obj, type) and issubclass(obj, Remedy)) or obj is Remedy:
        raise ValueError(
            f"remedy {spec!r}: {getattr(obj, '__name__', obj)!r} is not a subclass of timbench.remedies.Remedy"
        )
    if obj.__call__ is Remedy.__call__:
        raise ValueError(f"remedy {spec!r}: {obj.__name__} does not implement __call__(batch) -> RemedyResult")
    if obj.replay not in REPLAY_MODES:
        raise ValueError(f"remedy {spec!r}: replay={obj.replay!r} is invalid; valid: None, engine, old")
    for side in ("engine", "trainer"):
        override = getattr(obj, f"{side}_override")
        if not isinstance(override, dict):
            raise ValueError(f"remedy {spec!r}: {side}_override must be a dict of spec keys ({', '.join(SPEC_KEYS)})")
        parse_spec(override, f"remedy {spec!r} {side}_override")


def load_remedy(spec: str, args: dict | None = None) -> Remedy:
    """Resolve `spec` and instantiate it with parameter overrides `args` (unknown names rejected)."""
    cls = resolve(spec)
    try:
        remedy = cls(**dict(args or {}))
    except (ValueError, TypeError):  # the arguments given (Remedy.__init__ checks their names and values)
        raise
    except (Exception, SystemExit) as e:  # a plug-in's own __init__ raised (OSError, KeyError ...): not the input's
        if not cls.__module__.startswith("timbench."):
            raise _plugin_error(f"remedy {spec}: __init__", e) from e
        raise
    if not cls.name:  # a plug-in without a name is known by its spec
        remedy.name = spec
    return remedy


def describe(cls: type[Remedy]) -> dict:
    """Name, doc, parameters with defaults and hooks of a remedy class (for `timbench remedies list`)."""
    return {
        "name": cls.name,
        "doc": " ".join(cls.doc.split()),
        "params": {k: v["default"] for k, v in describe_params(cls.Params).items()},
        "param_docs": {k: v["doc"] for k, v in describe_params(cls.Params).items()},
        "hooks": {
            "replay": cls.replay,
            "engine_override": dict(cls.engine_override),
            "trainer_override": dict(cls.trainer_override),
            "trainer_follows_engine": list(cls.trainer_follows_engine),
            "mode": _implied_mode(cls),
            **{k: True for k in ("sampling_replay", "rollout_rounding") if getattr(cls, k)},
        },
    }


def _implied_mode(cls: type[Remedy]) -> str | None:
    if cls.mode is not None or not issubclass(cls, Verl):
        return cls.mode
    return "bypass" if cls.Params().bypass_mode else "recompute"  # a verl preset's default


def list_remedies() -> list[dict]:
    """Every registered remedy, the verl / TRL vocabulary, then every installed entry-point remedy, described."""
    rows = [describe(cls) for cls in REMEDIES.values()]
    rows += [
        describe(cls) | {"source": "verl" if name.startswith("verl") else "trl"} for name, cls in VOCABULARY.items()
    ]
    for name in sorted(_entry_points()):
        if name not in REMEDIES:
            rows.append(describe(resolve(name)) | {"name": name, "source": "entry point"})
    return rows
