"""Settings come from flags whose defaults come from environment variables; the helpers here declare
those flags and read the variables the same way for every command.

The parser reads no environment: a flag's variable is read by the command that runs
(:func:`resolve_environment`), through the flag's own conversion, so that a malformed variable is
an error of that command only (``HEALTH_PORT=x dra-driver --version`` still prints the version), and
says the same thing the flag would, naming the variable.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver import apiprofile

ENV_FLAGS = "_environment_flags"
"""The namespace attribute under which a parser lists its flags that have a variable."""
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingsError(Exception):
    """A setting that cannot be used (a malformed environment variable, flags that contradict each
    other, a value the kubelet would refuse), raised while a command's settings are read, before
    anything runs. The command prints it as its one line and exits 1 (:mod:`dra_driver.cli`); not a
    ValueError, so that a bug's ValueError is never reported as the user's setting."""


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


# --- conversions: shared by a flag and its variable; ArgumentTypeError's text follows the name ------


def boolean(text: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")


def port(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (0-65535, 0: off), got {text!r}")
    return value


def _finite_number(text: str, zero_ok: bool, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 if zero_ok else value > 0) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_number(text: str) -> float:
    return _finite_number(text, False, "a positive number")


def non_negative_number(text: str) -> float:
    return _finite_number(text, True, "0 or a positive number")


def positive_integer(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number, 1 or more, got {text!r}")
    return value


def one_of(choices: Iterable[str]) -> Callable[[str], str]:
    allowed = tuple(choices)

    def convert(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(allowed)}, got {text!r}")
        return text

    return convert


def text(value: str) -> str:
    return value


# --- flags with a variable ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvFlag:
    dest: str
    flag: str
    variable: str
    default: Any
    """The value when neither the flag nor the variable is set."""
    convert: Callable[[str], Any]


def add_env_argument(parser: argparse.ArgumentParser, flag: str, *aliases: str, variable: str, default: Any = None,
                     convert: Callable[[str], Any] = text, help: str, boolean_flag: bool = False,
                     choices: Iterable[str] | None = None, shown: str | None = None) -> None:
    """``flag`` (with ``aliases``), whose value is ``$variable`` when it is not given, else ``default``;
    ``boolean_flag``: ``--flag``/``--no-flag`` (the variable reads true/false); ``shown``: the default
    as help prints it, where ``default`` itself would not read well."""
    listed = tuple(choices) if choices is not None else None
    if listed is not None and convert is text:
        convert = one_of(listed)
    shown_default = shown if shown is not None else _show(default)
    where = f"${variable}" + (f"; default {shown_default}" if shown_default else "")
    described = help if help == argparse.SUPPRESS else f"{help} [{where}]"
    if boolean_flag:
        action = parser.add_argument(flag, *aliases, action=argparse.BooleanOptionalAction, default=None,
                                     help=described)
        convert = boolean
    else:
        action = parser.add_argument(flag, *aliases, type=convert, default=None, help=described,
                                     metavar="{" + ",".join(listed) + "}" if listed else None)
    known = tuple(parser.get_default(ENV_FLAGS) or ())
    parser.set_defaults(**{ENV_FLAGS: (*known, EnvFlag(action.dest, flag, variable, default, convert))})


def _show(default: Any) -> str:
    if default is None or default == "":
        return ""
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, (tuple, list)):
        return ",".join(map(str, default))
    return str(default)


def resolve_environment(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Fills in every flag of ``args``'s command that was not given from its variable (converted as the
    flag is), else its default. SettingsError names a variable that does not convert. Idempotent."""
    environ = os.environ if environ is None else environ
    for spec in getattr(args, ENV_FLAGS, ()):
        if getattr(args, spec.dest, None) is not None:
            continue
        raw = environ.get(spec.variable, "")
        if raw == "":
            setattr(args, spec.dest, spec.default)
            continue
        try:
            value = spec.convert(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise SettingsError(f"${spec.variable} (for {spec.flag}): {exc}") from None
        setattr(args, spec.dest, value)
    if hasattr(args, "api_profile") and hasattr(args, "driver_name"):
        try:
            profile = apiprofile.get(args.api_profile) if args.api_profile else apiprofile.for_driver(args.driver_name)
            args.api_profile, args.driver_name = profile.name, profile.driver_name(args.driver_name)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    return args


def api_profile(args: argparse.Namespace) -> apiprofile.ApiProfile:
    """The profile of a command's resolved ``args`` (this driver's own where it has no --api-profile)."""
    return apiprofile.get(getattr(args, "api_profile", None) or apiprofile.DRA_DRIVER)


def add_shared_arguments(parser: argparse.ArgumentParser, *, kubeconfig: bool = True, driver_name: bool = True) -> None:
    """``--kubeconfig``, ``--api-profile`` and ``--driver-name``, the flags of the programs and the operator
    tools alike. The driver name's default is the profile's (:func:`resolve_environment` sets it)."""
    if driver_name:
        add_env_argument(parser, "--api-profile", variable="API_PROFILE", default=None, choices=apiprofile.NAMES,
                         shown="dra-driver; nvidia with --driver-name gpu.nvidia.com",
                         help="Whose names the devices, attributes, classes and taints have: dra-driver (this "
                              "driver's) or nvidia (NVIDIA's DRA driver's, driver gpu.nvidia.com)")
        add_env_argument(parser, "--driver-name", variable="DRIVER_NAME", default=None,
                         help="DRA driver name", shown=f"{apiprofile.OWN.default_driver_name}; "
                                                       f"{apiprofile.NVIDIA_DRIVER_NAME} with --api-profile nvidia")
    if kubeconfig:
        # $KUBECONFIG is not this flag's default: it is a list of files, merged (dra_driver.k8s.credentials).
        parser.add_argument("--kubeconfig", default=None, metavar="FILE",
                            help="kubeconfig file; when unset: the files in $KUBECONFIG, else ~/.kube/config, else "
                                 "the in-cluster service account (client-go's order)")


def add_scheduler_rules_argument(parser: argparse.ArgumentParser, choices: tuple[str, ...]) -> None:
    """``--scheduler-rules``: which kube-scheduler version's allocation rules the engine follows
    (``choices``: ``auto`` and the minors the engine knows, dra_driver.allocator.rules)."""
    add_env_argument(parser, "--scheduler-rules", variable="SCHEDULER_RULES", default="auto", choices=choices,
                     help="Decide as the kube-scheduler of this Kubernetes version does; auto: the API server's "
                          "version, re-read now and then")
