"""The library calls' arguments, checked where the call is made: one clear ``UsageError``.

``@checked`` wraps a ``packer.api`` function. Before the function runs, every argument is
checked against the parameter's annotation (``workers="2"`` is refused naming ``workers``,
``resize=256`` naming ``packer.ResizeSpec``) and against the rule :data:`RULES` keeps for a
parameter of that name (the same name means the same thing in every command: ``workers`` is
never negative, ``out`` names a file or folder). ``help()`` still shows the function's own
signature.
"""
from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import numbers
import os
import typing
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

from packer.conversion.options import SOURCE_FORMATS
from packer.errors import UsageError

__all__ = ["checked", "RULES"]

F = TypeVar("F", bound=Callable[..., Any])


def _is_url(value: Any) -> bool:
    return isinstance(value, str) and "://" in value


def _names_a_path(value: Any) -> Optional[str]:
    if _is_url(value):
        return None
    name = Path(value).name
    if not os.fspath(value) or name in ("", ".", ".."):
        return "must name the output itself (such as out.lmdb), not a folder to make it in"
    return None


def _local_path(value: Any) -> Optional[str]:
    if _is_url(value):
        return "must be a local path; this command does not read or write URLs"
    return _names_a_path(value)


def _at_least(low: float, *, exclusive: bool = False) -> Callable[[Any], Optional[str]]:
    def rule(value: Any) -> Optional[str]:
        values = value if isinstance(value, collections.abc.Sequence) else [value]
        for v in values:
            if isinstance(v, numbers.Real) and (math.isnan(v) or v < low or (exclusive and v == low)):
                return f"must be {'>' if exclusive else '>='} {low}"
        return None
    return rule


def _in_range(low: int, high: int) -> Callable[[Any], Optional[str]]:
    def rule(value: Any) -> Optional[str]:
        return None if low <= value <= high else f"must be in {low}..{high}"
    return rule


def _one_of(*choices: str) -> Callable[[Any], Optional[str]]:
    def rule(value: Any) -> Optional[str]:
        return None if value in choices else f"must be one of {', '.join(choices)}"
    return rule


def _registered(value: Any) -> Optional[str]:
    """A ``format`` names a registered image format (``packer.formats.FORMATS``)."""
    from packer.formats import FORMATS

    return None if value in FORMATS else f"must be one of {', '.join(FORMATS)}"


# What a parameter of this name must hold beyond its type (None values are not checked: a None
# means "the default" wherever a parameter may be None). Enumerations checked deeper with their
# own UsageError (``to``, ``backend``, ``codec``, ...) are not repeated here.
RULES: dict[str, Callable[[Any], Optional[str]]] = {
    "out": _names_a_path,
    "format": _registered,
    "check": _one_of("full", "header", "none"),
    "source_format": _one_of(*SOURCE_FORMATS),
    "workers": _at_least(0),
    "max_failures": _at_least(0),
    "num_shards": _at_least(1),
    "shard_index": _at_least(0),
    "commit_every": _at_least(1),
    "timeout": _at_least(0),
    "samples_per_shard": _at_least(1),
    "quality": _in_range(1, 100),
    "gop": _at_least(1),
    "crf": _at_least(0),
    "fps": _at_least(0, exclusive=True),
    "stride": _at_least(1),
    "max_frames": _at_least(1),
    "short_side": _at_least(1),
    "start_index": _at_least(0),
    "bound": _at_least(0, exclusive=True),
    "show": _at_least(0),
    "count": _at_least(1),
    "batch_size": _at_least(1),
    "steps": _at_least(1),
    "clips": _at_least(1),
    "fidelity": _at_least(0),
    "model_ms": _at_least(0),
    "resize": _at_least(1),
    "crop": _at_least(1),
}

# Per function: the parameters that must be local paths. (A numeric rule passes a value that is
# not a number: ``resize`` is a ResizeSpec in ``pack`` and a side length in ``bench``.)
LOCAL_ONLY = {"resize": ("src", "out", "list_path"), "export": ("out",)}


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if tp is os.PathLike or typing.get_origin(tp) is os.PathLike:
        return "a path"
    origin = typing.get_origin(tp)
    if origin is Union:
        names = []
        args = typing.get_args(tp)
        if str in args and any(a is os.PathLike or typing.get_origin(a) is os.PathLike for a in args):
            args = tuple(a for a in args if a is not str)  # a str or an os.PathLike: "a path"
        for arg in args:
            name = _describe(arg)
            if name not in names:
                names.append(name)
        return " or ".join(names)
    if origin in (collections.abc.Sequence, list):
        return f"a list (each {_describe(typing.get_args(tp)[0])})"
    if origin is tuple:
        return f"a tuple ({', '.join(_describe(a) for a in typing.get_args(tp))})"
    if isinstance(tp, type):
        if tp.__module__.startswith("packer"):
            return f"a packer.{tp.__name__}"
        return {"int": "an integer", "float": "a number", "str": "a string", "bool": "True or False"}.get(
            tp.__name__, tp.__name__)
    return str(tp)


def _matches(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin is Union:
        return any(_matches(value, arg) for arg in typing.get_args(tp))
    if tp is os.PathLike or origin is os.PathLike:
        return isinstance(value, os.PathLike)
    if origin in (collections.abc.Sequence, list):
        return (isinstance(value, (list, tuple)) and not isinstance(value, (str, bytes))
                and all(_matches(v, typing.get_args(tp)[0]) for v in value))
    if origin is tuple:
        args = typing.get_args(tp)
        return (isinstance(value, tuple) and len(value) == len(args)
                and all(_matches(v, a) for v, a in zip(value, args)))
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True  # an annotation this checker does not model is not checked


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s annotations evaluated, with the names its module imports only for type checking."""
    from packer.codecs.resize import ResizeSpec

    def parameters() -> None:
        """The parameters' annotations alone (the return annotation may name a class not imported)."""

    parameters.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "return"}
    namespace = {**vars(inspect.getmodule(fn)), "ResizeSpec": ResizeSpec}
    return typing.get_type_hints(parameters, globalns=namespace)


def checked(fn: F) -> F:
    """Wrap a library call so that a wrong type or value is a ``UsageError`` naming the
    parameter, raised before the call does anything."""
    signature = inspect.signature(fn)
    hints: dict[str, Any] = {}
    local = LOCAL_ONLY.get(fn.__name__, ())

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hints:
            hints.update(_hints(fn))
        bound = signature.bind(*args, **kwargs)  # a wrong name or count: Python's own TypeError
        for name, value in bound.arguments.items():
            tp = hints.get(name)
            if tp is not None and not _matches(value, tp):
                raise UsageError(f"packer.{fn.__name__}: {name} must be {_describe(tp)}, "
                                 f"not {value!r} ({type(value).__name__})")
            rule = _local_path if name in local else RULES.get(name)
            if value is None or rule is None:
                continue
            why = rule(value)
            if why is not None:
                raise UsageError(f"packer.{fn.__name__}: {name} {why}, not {value!r}")
        return fn(*args, **kwargs)

    return typing.cast(F, wrapper)
