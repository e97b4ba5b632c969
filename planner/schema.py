"""A small validation layer for the specs: frozen, strictly typed records built from YAML.

It does what planner.specs needs of pydantic, in pure Python so that a plan starts fast:
fields declared as annotations (`name: str`, `hidden_size: Count(4096)`, `x: T | None = None`,
`list[...]`, `Literal[...]`, nested specs), defaults, extra="forbid" or "allow", "before"
field validators, "before" and "after" model validators, and errors collected the way
pydantic collects them (the fields in declaration order, then the unknown keys; nested
locations; the same error types, messages and context), so messages built from
`ValidationError.errors()` read as they did. Like pydantic, `model_copy(update=...)` does
not re-validate.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

Loc = tuple[Any, ...]
T = TypeVar("T")


class ValidationError(ValueError):
    """Every problem found in one input; `errors()` lists them as pydantic's does."""

    def __init__(self, title: str, errors: list[dict[str, Any]]) -> None:
        self.title = title
        self._errors = errors
        first = errors[0]
        super().__init__(f"{len(errors)} validation error(s) for {title}: "
                         f"{'.'.join(map(str, first['loc']))}: {first['msg']}")

    def errors(self) -> list[dict[str, Any]]:
        return list(self._errors)


def _error(errors: list, kind: str, loc: Loc, msg: str, value: Any, **ctx: Any) -> None:
    entry = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx:
        entry["ctx"] = ctx
    errors.append(entry)


_MISSING = object()


class Validator:
    """Checks one value; appends errors and returns _MISSING when it is refused."""

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        raise NotImplementedError

    def __or__(self, other: Any) -> Validator:
        assert other is None or other is type(None), "only `T | None` is supported"
        return Nullable(self)

    def __ror__(self, other: Any) -> Validator:
        return self.__or__(other)


class _Bounded(Validator):
    def __init__(self, ge: Any = None, gt: Any = None, le: Any = None) -> None:
        self.ge, self.gt, self.le = ge, gt, le

    def _bounds(self, value: Any, loc: Loc, errors: list) -> Any:
        if self.le is not None and not value <= self.le:
            _error(errors, "less_than_equal", loc, f"Input should be less than or equal to {self.le:g}",
                   value, le=self.le)
        elif self.ge is not None and not value >= self.ge:
            _error(errors, "greater_than_equal", loc, f"Input should be greater than or equal to {self.ge:g}",
                   value, ge=self.ge)
        elif self.gt is not None and not value > self.gt:
            _error(errors, "greater_than", loc, f"Input should be greater than {self.gt:g}", value,
                   gt=self.gt)
        else:
            return value
        return _MISSING


class StrictInt(_Bounded):
    """An int (not a bool, not 4096.0, not "4096") within the bounds."""

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            _error(errors, "int_type", loc, "Input should be a valid integer", value)
            return _MISSING
        return self._bounds(int(value), loc, errors)


class StrictFloat(_Bounded):
    """A finite number (an int is taken and becomes a float; a bool is not) within the bounds."""

    def __init__(self, ge: float | None = None, gt: float | None = None, le: float | None = None) -> None:
        super().__init__(*(None if bound is None else float(bound) for bound in (ge, gt, le)))

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _error(errors, "float_type", loc, "Input should be a valid number", value)
            return _MISSING
        try:
            number = float(value)
        except OverflowError:  # an int beyond the float range
            _error(errors, "float_type", loc, "Input should be a valid number", value)
            return _MISSING
        if not math.isfinite(number):
            _error(errors, "finite_number", loc, "Input should be a finite number", value)
            return _MISSING
        return number if self._bounds(value, loc, errors) is not _MISSING else _MISSING


class StrictBool(Validator):
    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        if value is True or value is False:
            return value
        _error(errors, "bool_type", loc, "Input should be a valid boolean", value)
        return _MISSING


class Name(Validator):
    """A name: a string with something besides white space (it labels output, files and the
    served model in launch commands)."""

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        text = Str()(value, loc, errors, context)
        if text is not _MISSING and not text.strip():
            _error(errors, "string_too_short", loc, "must not be empty or blank", value)
            return _MISSING
        return text


class Str(Validator):
    """A string; bytes are decoded as UTF-8 (pydantic's lax mode)."""

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        if isinstance(value, str):
            return str(value)
        if isinstance(value, bytes | bytearray):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                _error(errors, "string_unicode", loc,
                       "Input should be a valid string, unable to parse raw data as a unicode string",
                       value)
                return _MISSING
        _error(errors, "string_type", loc, "Input should be a valid string", value)
        return _MISSING


class OneOf(Validator):
    """typing.Literal of strings."""

    def __init__(self, choices: tuple[Any, ...]) -> None:
        self.choices = choices
        quoted = [repr(choice) for choice in choices]
        self.expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        for choice in self.choices:
            if type(value) is type(choice) and value == choice:
                return choice
        _error(errors, "literal_error", loc, f"Input should be {self.expected}", value,
               expected=self.expected)
        return _MISSING


class Nullable(Validator):
    def __init__(self, inner: Validator) -> None:
        self.inner = inner

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        return None if value is None else self.inner(value, loc, errors, context)


class ListOf(Validator):
    """A list (a tuple or set is taken, as pydantic's lax mode does), each item checked."""

    def __init__(self, item: Validator) -> None:
        self.item = item

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        if not isinstance(value, list | tuple | set | frozenset):
            _error(errors, "list_type", loc, "Input should be a valid list", value)
            return _MISSING
        before = len(errors)
        items = [self.item(item, (*loc, index), errors, context) for index, item in enumerate(value)]
        return items if len(errors) == before else _MISSING


class Nested(Validator):
    def __init__(self, schema: type[Spec]) -> None:
        self.schema = schema

    def __call__(self, value: Any, loc: Loc, errors: list, context: Any) -> Any:
        return self.schema._validate(value, loc, errors, context)


class Field:
    """A default, or a factory for a mutable default: `aliases: list[str] = Field(default_factory=list)`."""

    def __init__(self, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None) -> None:
        self.default, self.default_factory = default, default_factory


class _Field:
    __slots__ = ("name", "check", "default", "factory", "before")

    def __init__(self, name: str, check: Validator, default: Any) -> None:
        self.name, self.check, self.before = name, check, None
        self.factory = default.default_factory if isinstance(default, Field) else None
        self.default = default.default if isinstance(default, Field) else default

    @property
    def is_required(self) -> bool:
        return self.default is _MISSING and self.factory is None


class _Hook:
    """A validator method marked by field_validator / model_validator until its class is built."""

    def __init__(self, kind: str, mode: str, method: Any, fields: tuple[str, ...] = ()) -> None:
        self.kind, self.mode, self.method, self.fields = kind, mode, method, fields


def field_validator(*fields: str, mode: str = "before") -> Callable[[Any], _Hook]:
    """`(cls, value, info) -> value`, run on the raw value before its type is checked."""
    assert mode == "before", "only before field validators are supported"
    return lambda method: _Hook("field", mode, method, fields)


def model_validator(*, mode: str) -> Callable[[Any], _Hook]:
    """mode="before": `(cls, data) -> data` on the raw input; "after": `(self) -> self`."""
    assert mode in ("before", "after")
    return lambda method: _Hook("model", mode, method)


class ValidationInfo:
    def __init__(self, context: Any) -> None:
        self.context = context


def _compile(annotation: Any, where: str) -> Validator:
    if isinstance(annotation, Validator):
        return annotation
    if annotation is str:
        return Str()
    if isinstance(annotation, type) and issubclass(annotation, Spec):
        return Nested(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return OneOf(args)
    if origin is list:
        return ListOf(_compile(args[0], where))
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return Nullable(_compile(next(arg for arg in args if arg is not type(None)), where))
    raise TypeError(f"{where}: unsupported annotation {annotation!r}")


class Spec:
    """A frozen record validated on construction: `Spec(**fields)` or `Spec.model_validate`.

    Field values live in the instance __dict__ (in field order), the unknown keys an
    extra="allow" spec keeps in `_extra` (None for extra="forbid")."""

    __slots__ = ("__dict__", "_extra", "_hash", "_derived")
    _fields: dict[str, _Field] = {}
    _extra_allowed = False
    _before: tuple[Any, ...] = ()
    _after: tuple[Any, ...] = ()

    def __init_subclass__(cls, extra: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if extra is not None:
            assert extra in ("forbid", "allow")
            cls._extra_allowed = extra == "allow"
        namespace = sys.modules[cls.__module__].__dict__
        fields = dict(cls._fields)
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if name.startswith("_"):
                continue
            if isinstance(annotation, str):
                annotation = eval(annotation, namespace, {cls.__name__: cls})  # noqa: S307
            default = cls.__dict__.get(name, _MISSING)
            fields[name] = _Field(name, _compile(annotation, f"{cls.__name__}.{name}"), default)
        before, after = list(cls._before), list(cls._after)
        for attr, hook in list(cls.__dict__.items()):
            if not isinstance(hook, _Hook):
                continue
            setattr(cls, attr, hook.method)
            method = getattr(cls, attr)
            if hook.kind == "field":
                for name in hook.fields:
                    fields[name].before = method
            else:
                (before if hook.mode == "before" else after).append(attr)
        cls._fields, cls._before, cls._after = fields, tuple(before), tuple(after)
        cls.model_fields = fields

    def __init__(self, **data: Any) -> None:
        errors: list = []
        validated = type(self)._validate(data, (), errors, None)
        if errors:
            raise ValidationError(type(self).__name__, errors)
        object.__setattr__(self, "__dict__", validated.__dict__)
        object.__setattr__(self, "_extra", validated._extra)

    @classmethod
    def model_validate(cls, data: Any, *, context: dict[str, Any] | None = None) -> Any:
        errors: list = []
        result = cls._validate(data, (), errors, context)
        if errors:
            raise ValidationError(cls.__name__, errors)
        return result

    @classmethod
    def _validate(cls, data: Any, loc: Loc, errors: list, context: Any) -> Any:
        if isinstance(data, cls):
            return data
        before = len(errors)
        values, extra = cls._values(data, loc, errors, context)
        if len(errors) > before:
            return _MISSING
        instance = cls._build(values, extra)
        for name in cls._after:
            try:
                instance = getattr(cls, name)(instance)
            except ValueError as exc:
                _error(errors, "value_error", loc, f"Value error, {exc}", data, error=exc)
                return _MISSING
        return instance

    @classmethod
    def _build(cls, values: dict[str, Any], extra: dict[str, Any] | None) -> Any:
        instance = cls.__new__(cls)
        object.__setattr__(instance, "__dict__", values)
        object.__setattr__(instance, "_extra", extra)
        return instance

    @classmethod
    def _values(cls, data: Any, loc: Loc, errors: list,
                context: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The checked field values in field order, and the unknown keys where allowed."""
        for name in cls._before:
            data = getattr(cls, name)(data)
        if not isinstance(data, dict):
            _error(errors, "model_type", loc, f"Input should be a valid dictionary or instance of "
                   f"{cls.__name__}", data, class_name=cls.__name__)
            return {}, None
        values: dict[str, Any] = {}
        extra: dict[str, Any] | None = {} if cls._extra_allowed else None
        for name, field in cls._fields.items():
            if name not in data:
                if field.is_required:
                    _error(errors, "missing", (*loc, name), "Field required", data)
                else:
                    values[name] = field.factory() if field.factory else field.default
                continue
            value = data[name]
            if field.before is not None:
                try:
                    value = field.before(value, ValidationInfo(context))
                except ValueError as exc:
                    _error(errors, "value_error", (*loc, name), f"Value error, {exc}", value, error=exc)
                    continue
            values[name] = field.check(value, (*loc, name), errors, context)
        for key, value in data.items():
            if not isinstance(key, str):
                _error(errors, "invalid_key", (*loc, key), "Keys should be strings", key)
            elif key not in cls._fields:
                if extra is not None:
                    extra[key] = value
                else:
                    _error(errors, "extra_forbidden", (*loc, key), "Extra inputs are not permitted", value)
        return values, extra

    def __getattr__(self, name: str) -> Any:
        """The unknown keys an extra="allow" spec keeps, as attributes."""
        extra = object.__getattribute__(self, "_extra") if name != "_extra" else None
        if extra and name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise ValidationError(type(self).__name__, [
            {"type": "frozen_instance", "loc": (name,), "msg": "Instance is frozen", "input": value}])

    def __delattr__(self, name: str) -> None:
        raise ValidationError(type(self).__name__, [
            {"type": "frozen_instance", "loc": (name,), "msg": "Instance is frozen", "input": None}])

    def __reduce__(self) -> tuple:
        """Pickled as its fields and kept unknown keys, rebuilt without validation (it was valid);
        its cached hash and derived values are recomputed on the other side."""
        return type(self)._build, (dict(self.__dict__), None if self._extra is None else dict(self._extra))

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Any:
        """A shallow copy with some fields replaced, not re-validated (as pydantic's)."""
        values, extra = dict(self.__dict__), None if self._extra is None else dict(self._extra)
        for key, value in (update or {}).items():
            (values if extra is None or key in type(self)._fields else extra)[key] = value
        return type(self)._build(values, extra)

    def model_dump(self, *, mode: str = "python", exclude_none: bool = False) -> dict[str, Any]:
        """Fields (then kept unknown keys) as plain data; nested specs become mappings."""
        items = {**self.__dict__, **(self._extra or {})}.items()
        return {key: _dump(value, mode, exclude_none) for key, value in items
                if not (exclude_none and value is None)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spec):
            return NotImplemented
        return (type(self) is type(other) and self.__dict__ == other.__dict__
                and self._extra == other._extra)

    def __hash__(self) -> int:
        """By value, computed once (the instance is frozen): specs key the cost model's memos."""
        try:
            return object.__getattribute__(self, "_hash")
        except AttributeError:
            value = hash((type(self), tuple(self.__dict__[name] for name in type(self)._fields)))
            object.__setattr__(self, "_hash", value)
            return value

    def derived(self, compute: Callable[..., T], *args: Hashable) -> T:
        """compute(self, *args), computed once per instance and arguments: a pure function of
        a frozen spec (and a few numbers, such as a TP degree), which the serving search asks
        for with every layout, stage and step (the parameter counts, a block's bytes per GPU).
        A copy (model_copy) is a new instance and computes its own."""
        try:
            values = object.__getattribute__(self, "_derived")
        except AttributeError:
            values = {}
            object.__setattr__(self, "_derived", values)
        key = (compute, *args)
        try:
            return values[key]
        except KeyError:
            value = values[key] = compute(self, *args)
            return value

    def __repr__(self) -> str:
        items = {**self.__dict__, **(self._extra or {})}.items()
        inner = ", ".join(f"{key}={value!r}" for key, value in items)
        return f"{type(self).__name__}({inner})"


def _dump(value: Any, mode: str, exclude_none: bool) -> Any:
    if isinstance(value, Spec):
        return value.model_dump(mode=mode, exclude_none=exclude_none)
    if isinstance(value, list | tuple):
        items = [_dump(item, mode, exclude_none) for item in value]
        return items if mode == "json" or isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {key: _dump(item, mode, exclude_none) for key, item in value.items()}
    if mode == "json" and isinstance(value, float) and not math.isfinite(value):
        return None
    return value
