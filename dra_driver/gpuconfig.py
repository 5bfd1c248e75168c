"""The driver's opaque configuration API, ``gpu.dra-driver.io/v1alpha1`` kind ``GpuConfig``.

A claim (or a DeviceClass) carries it in ``spec.devices.config[].opaque.parameters`` with
``opaque.driver`` set to the driver name::

    {"apiVersion": "gpu.dra-driver.io/v1alpha1", "kind": "GpuConfig",
     "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}}

Decoding is strict: an unknown field, a wrong type, an out-of-range value or a wrong
``apiVersion``/``kind`` raises :class:`ConfigError`, whose message starts with the path of the
offending field. See ``api/config/v1alpha1/README.md`` for the user-facing description.

:func:`matching_configs` applies the precedence rules of ``status.allocation.devices.config``:
only entries for this driver whose ``requests`` is empty or names the result's request, class
configs before claim configs, later entries win. Which of them applies to each device, in either
this API or NVIDIA's (:mod:`dra_driver.nvidiaconfig`), is :mod:`dra_driver.opaqueconfig`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver import CONFIG_API_VERSION
from dra_driver.k8s.quantity import QuantityError, parse_quantity

KIND = "GpuConfig"


class ConfigError(ValueError):
    """An opaque ``GpuConfig`` (a claim's or a DeviceClass's ``config[].opaque.parameters``) the
    driver cannot accept; ``path`` is the offending field's, ``detail`` what is wrong with it. The
    user's object is wrong, not the driver's setup: not to be confused with
    :class:`dra_driver.k8s.credentials.KubeconfigError`."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` prepended to its field path."""
        path = f"{prefix}.{self.path}" if self.path and prefix else (prefix or self.path)
        return ConfigError(path, self.detail)


class Strategy(StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class TimeSliceInterval(StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


@dataclass(frozen=True)
class MpsSettings:
    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: str | None = None
    """The quantity as the user wrote it, e.g. ``10Gi``."""
    default_pinned_device_memory_limit_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.default_active_thread_percentage is not None:
            out["defaultActiveThreadPercentage"] = self.default_active_thread_percentage
        if self.default_pinned_device_memory_limit is not None:
            out["defaultPinnedDeviceMemoryLimit"] = self.default_pinned_device_memory_limit
        return out


@dataclass(frozen=True)
class SharingConfig:
    strategy: Strategy = Strategy.EXCLUSIVE
    interval: TimeSliceInterval | None = None
    """Set (``Default`` when not given) only for TimeSlicing."""
    mps: MpsSettings | None = None
    """Set (possibly empty) only for MPS."""

    @property
    def allows_sharing(self) -> bool:
        return self.strategy is not Strategy.EXCLUSIVE

    def compatible_with(self, other: SharingConfig) -> bool:
        """Whether two claims with these configs may use the same physical GPU at once.

        Both must share with the same strategy; time-slicing also needs the same interval because
        the interval is a GPU-wide setting. MPS limits are per client, so they may differ.
        """
        if not (self.allows_sharing and other.allows_sharing) or self.strategy is not other.strategy:
            return False
        return self.strategy is not Strategy.TIME_SLICING or self.interval == other.interval

    def describe(self) -> str:
        """``Exclusive``, ``TimeSlicing:Long``, ``MPS`` or ``MPS:activeThreadPercentage=50,...``."""
        if self.strategy is Strategy.TIME_SLICING:
            return f"TimeSlicing:{(self.interval or TimeSliceInterval.DEFAULT).value}"
        if self.strategy is Strategy.MPS:
            parts = [f"{k}={v}" for k, v in (self.mps or MpsSettings()).to_dict().items()]
            return "MPS" + (":" + ",".join(parts) if parts else "")
        return "Exclusive"

    def to_dict(self) -> dict[str, Any]:
        """The ``sharing`` object of the API (round-trips through :func:`decode_sharing`)."""
        out: dict[str, Any] = {"strategy": self.strategy.value}
        if self.strategy is Strategy.TIME_SLICING:
            out["timeSlicing"] = {"interval": (self.interval or TimeSliceInterval.DEFAULT).value}
        if self.strategy is Strategy.MPS:
            out["mps"] = (self.mps or MpsSettings()).to_dict()
        return out


EXCLUSIVE = SharingConfig()


@dataclass(frozen=True)
class GpuConfig:
    sharing: SharingConfig = EXCLUSIVE


DEFAULT_CONFIG = GpuConfig()

# --- strict decoding --------------------------------------------------------------------------


def type_name(value: Any) -> str:
    """A JSON value's type as an error message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def strict_object(value: Any, path: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    """``value`` as an object with no field outside ``allowed``; ConfigError naming the first other one."""
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be an object, got {type_name(value)}")
    for key in value:
        if key not in allowed:
            # An empty or non-string key is quoted, so the message still names the field.
            name = key if isinstance(key, str) and key else repr(key)
            where = f"{path}.{name}" if path else name
            raise ConfigError(where, f"unknown field (allowed: {', '.join(allowed)})")
    return value


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def enum_value(value: Any, path: str, choices: type[StrEnum]) -> Any:
    """``value`` as a member of ``choices``; ConfigError listing them otherwise."""
    names = [c.value for c in choices]
    if not isinstance(value, str):
        raise ConfigError(path, f"must be a string, one of {', '.join(names)}; got {type_name(value)}")
    try:
        return choices(value)
    except ValueError:
        raise ConfigError(path, f"must be one of {', '.join(names)}, got {value!r}") from None


def decode_percentage(value: Any, path: str) -> int:
    """An MPS client's active-thread percentage: an integer from 1 to 100."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"must be an integer, got {type_name(value)}")
    if not 1 <= value <= 100:
        raise ConfigError(path, f"must be between 1 and 100, got {value}")
    return value


def decode_memory_limit(value: Any, path: str) -> tuple[str, int]:
    """An MPS client's pinned-memory limit: the quantity as written and its bytes, at least 1Mi."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(path, f"must be a quantity string such as \"10Gi\", got {type_name(value)}")
    text = str(value)
    try:
        # Parse the text form: it is what to_dict() stores and the checkpoint decodes again, so an
        # integer must not pass where its own spelling would not.
        amount = parse_quantity(text).value
    except QuantityError:
        raise ConfigError(path, f"must be a quantity such as \"10Gi\" or \"512M\", got {text!r}") from None
    if amount < 2**20:
        raise ConfigError(path, f"must be at least 1Mi, got {text!r}")
    return text, int(amount)


def _decode_mps(value: Any, path: str) -> MpsSettings:
    obj = strict_object(value, path, ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit"))
    pct, mem = obj.get("defaultActiveThreadPercentage"), obj.get("defaultPinnedDeviceMemoryLimit")
    percentage = None if pct is None else decode_percentage(pct, join_path(path, "defaultActiveThreadPercentage"))
    if mem is None:
        return MpsSettings(percentage)
    text, amount = decode_memory_limit(mem, join_path(path, "defaultPinnedDeviceMemoryLimit"))
    return MpsSettings(percentage, text, amount)


def decode_sharing(value: Any, path: str = "sharing") -> SharingConfig:
    """Decode the ``sharing`` object; ``None`` means Exclusive."""
    if value is None:
        return EXCLUSIVE
    obj = strict_object(value, path, ("strategy", "timeSlicing", "mps"))
    raw_strategy = obj.get("strategy")
    strategy = (
        Strategy.EXCLUSIVE if raw_strategy is None else enum_value(raw_strategy, join_path(path, "strategy"), Strategy)
    )
    ts_path, mps_path = join_path(path, "timeSlicing"), join_path(path, "mps")
    interval: TimeSliceInterval | None = None
    mps: MpsSettings | None = None
    if obj.get("timeSlicing") is not None:
        if strategy is not Strategy.TIME_SLICING:
            raise ConfigError(ts_path, f"only allowed with strategy TimeSlicing, strategy is {strategy.value}")
        ts = strict_object(obj["timeSlicing"], ts_path, ("interval",))
        if ts.get("interval") is not None:
            interval = enum_value(ts["interval"], join_path(ts_path, "interval"), TimeSliceInterval)
    if obj.get("mps") is not None:
        if strategy is not Strategy.MPS:
            raise ConfigError(mps_path, f"only allowed with strategy MPS, strategy is {strategy.value}")
        mps = _decode_mps(obj["mps"], mps_path)
    if strategy is Strategy.TIME_SLICING:
        return SharingConfig(strategy, interval or TimeSliceInterval.DEFAULT, None)
    if strategy is Strategy.MPS:
        return SharingConfig(strategy, None, mps or MpsSettings())
    return EXCLUSIVE


def decode(parameters: Any) -> GpuConfig:
    """Strictly decode opaque parameters into a :class:`GpuConfig`."""
    obj = strict_object(parameters, "", ("apiVersion", "kind", "sharing"))
    api_version = obj.get("apiVersion")
    if api_version != CONFIG_API_VERSION:
        got = "nothing" if api_version is None else repr(api_version)
        raise ConfigError("apiVersion", f"must be {CONFIG_API_VERSION!r}, got {got}")
    kind = obj.get("kind")
    if kind != KIND:
        got = "nothing" if kind is None else repr(kind)
        raise ConfigError("kind", f"must be {KIND!r}, got {got}")
    return GpuConfig(decode_sharing(obj.get("sharing")))


def encode(config: GpuConfig) -> dict[str, Any]:
    return {"apiVersion": CONFIG_API_VERSION, "kind": KIND, "sharing": config.sharing.to_dict()}


# --- precedence -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchedConfig:
    index: int
    """Position in ``status.allocation.devices.config``."""
    source: str
    """``FromClass`` or ``FromClaim``."""
    parameters: Any
    requests: tuple[str, ...] = ()
    """The entry's ``requests``: empty when it applies to every request."""


def base_request(request: str) -> str:
    """``req/sub`` -> ``req``; a plain name is returned unchanged."""
    return request.split("/", 1)[0]


def request_matches(config_requests: Sequence[str] | None, request: str) -> bool:
    """Whether a config whose ``requests`` is ``config_requests`` applies to ``request``.

    Upstream rule: empty = every request; a main-request name applies to the request and all its
    subrequests (``req`` matches ``req/sub``); ``req/sub`` applies only to that subrequest.
    """
    if not config_requests:
        return True
    return any(name in (request, base_request(request)) for name in config_requests)


_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}


def matching_configs(configs: Sequence[Any] | None, request: str, driver: str) -> list[MatchedConfig]:
    """The opaque configs for ``driver`` that apply to ``request``, lowest precedence first."""
    found: list[MatchedConfig] = []
    for index, entry in enumerate(configs or ()):
        if not isinstance(entry, Mapping):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not request_matches([str(r) for r in requests], request):
            continue
        found.append(MatchedConfig(index, str(entry.get("source") or "FromClaim"), opaque.get("parameters"),
                                   tuple(str(r) for r in requests)))
    # Stable sort: class configs before claim configs, original order within each source.
    found.sort(key=lambda m: _SOURCE_ORDER.get(m.source, 1))
    return found
