"""Routes: which workers a task name goes to.

``Client(routes={"emails.*": ["tcp://mail-a:5555"], "*": ["tcp://w1:5555"]})``.
Patterns are ``fnmatch`` patterns, matched case-sensitively against the whole
task name. Precedence, first match wins:

1. a pattern without wildcards (``*?[``), that is an exact task name;
2. the other patterns, in the order the mapping gives them;
3. ``"*"``, wherever it is listed; else the client's ``endpoints``.

Each distinct endpoint set gets its own client, hence its own pools.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Mapping, Optional, Sequence, Union

from ..errors import ConfigurationError

DEFAULT = "*"
Endpoints = tuple[str, ...]


def _endpoints(pattern: str, value: Union[str, Sequence[str]]) -> Endpoints:
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ConfigurationError(f"route {pattern!r} needs a non-empty list of endpoints, got {value!r}",
                                 setting="routes")
    return names


class Routes:
    """Task-name patterns mapped to endpoint sets.

    :param routes: ``{pattern: endpoint or [endpoints]}``.
    :raises ConfigurationError: a pattern that is not a non-empty str, or an empty endpoint list.
    """

    def __init__(self, routes: Mapping[str, Union[str, Sequence[str]]]) -> None:
        if not isinstance(routes, Mapping):
            raise ConfigurationError(f"routes must be a mapping of pattern to endpoints, got {routes!r}",
                                     setting="routes")
        for pattern in routes:
            if not isinstance(pattern, str) or not pattern:
                raise ConfigurationError(f"a route pattern must be a non-empty str, got {pattern!r}", setting="routes")
        table = {pattern: _endpoints(pattern, value) for pattern, value in routes.items()}
        self.default: Optional[Endpoints] = table.pop(DEFAULT, None)
        self.exact = {pattern: value for pattern, value in table.items() if not any(c in pattern for c in "*?[")}
        self.patterns = [(pattern, value) for pattern, value in table.items() if pattern not in self.exact]

    def match(self, task: str) -> Optional[Endpoints]:
        """The endpoints of ``task``'s route, or ``None`` for the client's own endpoints."""
        if task in self.exact:
            return self.exact[task]
        for pattern, endpoints in self.patterns:
            if fnmatchcase(task, pattern):
                return endpoints
        return self.default

    def endpoint_sets(self) -> list[Endpoints]:
        """Every distinct endpoint set, in order of first mention."""
        sets = [*self.exact.values(), *(value for _, value in self.patterns)]
        sets += [self.default] if self.default else []
        return list(dict.fromkeys(sets))
