"""Settings every replica on one database must agree on, kept in that database.

Some settings are judged by whichever replica happens to run a sweep, against
rows all replicas share: with `--max-attempts` 1 on one replica and 3 on
another, the stricter one abandons rows the other would retry, and nobody is
told. So the first replica to start stores its values (one row per setting);
every later start compares its own with the stored ones. On a difference the
replica logs an ERROR naming each setting with both values and, by default,
refuses to start: an operator who meant the change says so with
`--on-settings-mismatch overwrite` (store this replica's values) or `adopt`
(run with the stored ones).

Refusing is the default because the alternatives hide a mistake: adopting
silently ignores the flag an operator just set; overwriting silently changes
the policy under replicas still running with the old values. A setting that
names a secret (the SessionService's PII key, stored as a digest) cannot be
adopted at all: the replica lacks the secret, so `adopt` refuses on it too.

Each service keeps its settings in a table of its own (`switchboard_shared_setting`
for the DeliveryService, `session_shared_setting` for the SessionService), so that
either may have a database to itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import peewee

from switchboard.database import Backend, SettingsMismatch, StartupRefused, bind_model

log = logging.getLogger(__name__)


#: The SessionService's table of shared settings (session migration 9); the
#: DeliveryService's is `SharedSettingRow`'s own (delivery migration 2). A table per
#: service, so that neither service's migrations depend on the other's.
SESSION_SETTINGS = "session_shared_setting"


class SharedSettingRow(peewee.Model):
    #: "<service>.<setting>", e.g. "delivery.max_attempts": services sharing one
    #: database (a Postgres schema) keep apart.
    name = peewee.CharField(max_length=128, primary_key=True)
    value = peewee.TextField()  # JSON

    class Meta:
        table_name = "switchboard_shared_setting"  # created by delivery migration 2


@dataclass(frozen=True)
class Shared:
    """One shared setting: its stored name, the flag that sets it, its value here."""

    name: str
    flag: str
    value: Any
    #: False for a value a replica cannot take over from the database (what names a
    #: secret it does not hold): `adopt` refuses to start on a difference instead.
    adoptable: bool = True


@dataclass(frozen=True)
class Difference:
    name: str
    flag: str
    ours: Any
    stored: Any
    adoptable: bool = True

    def describe(self) -> str:
        return (
            f"{self.name} ({self.flag}): this replica {_shown(self.ours)}, "
            f"the database {_shown(self.stored)}"
        )


class SettingsDisagree(StartupRefused):
    """This replica's shared settings differ from the database's."""


class SharedSettings:
    """The table of shared settings of one database."""

    def __init__(self, backend: Backend, table: str = "") -> None:
        """`table`: the service's table (default: the DeliveryService's)."""
        self.backend = backend
        self.Setting = bind_model(SharedSettingRow, backend.database, table)

    def agree(self, settings: list[Shared], policy: SettingsMismatch) -> dict[str, Any]:
        """Stores the settings the database lacks and compares the others; returns
        the value of each setting (by name) this replica must run with."""
        with self.backend.database.connection_context(), self.backend.write_transaction():
            for setting in settings:
                self.Setting.insert(
                    name=setting.name, value=_encoded(setting.value)
                ).on_conflict_ignore().execute()
            stored = self._stored([setting.name for setting in settings])
            differences = [
                Difference(s.name, s.flag, s.value, stored[s.name], s.adoptable)
                for s in settings
                if _normal(s.value) != _normal(stored[s.name])
            ]
            if differences and policy == "overwrite":
                for difference in differences:
                    self.Setting.update(value=_encoded(difference.ours)).where(
                        self.Setting.name == difference.name
                    ).execute()
        ours = {setting.name: setting.value for setting in settings}
        if not differences:
            return ours
        if policy == "refuse":
            for difference in differences:
                log.error("shared setting differs from the database's: %s", difference.describe())
            raise SettingsDisagree(
                "this replica's settings differ from the ones stored in the database, which "
                "every replica on it must share:\n  "
                + "\n  ".join(difference.describe() for difference in differences)
                + "\nstart it with the database's values, or with --on-settings-mismatch adopt "
                "(run with the database's) or overwrite (store this replica's; replicas "
                "already running keep theirs until restarted)"
            )
        if policy == "adopt":
            _refuse_unadoptable(differences)
            for difference in differences:
                log.warning("adopting the database's setting: %s", difference.describe())
            return {**ours, **{d.name: d.stored for d in differences}}
        for difference in differences:
            log.warning(
                "overwrote the database's setting (replicas running with the old value keep "
                "it until restarted): %s",
                difference.describe(),
            )
        return ours

    def _stored(self, names: list[str]) -> dict[str, Any]:
        rows = self.Setting.select().where(self.Setting.name.in_(names))
        return {row.name: json.loads(row.value) for row in rows}


def _refuse_unadoptable(differences: list[Difference]) -> None:
    unadoptable = [difference for difference in differences if not difference.adoptable]
    for difference in unadoptable:
        log.error("shared setting cannot be adopted: %s", difference.describe())
    if unadoptable:
        raise SettingsDisagree(
            "this replica cannot adopt the database's value of a setting that names a "
            "secret it does not hold:\n  "
            + "\n  ".join(difference.describe() for difference in unadoptable)
            + "\ngive it the secret the other replicas have, or start it with "
            "--on-settings-mismatch overwrite to make its own the one stored"
        )


def _encoded(value: Any) -> str:
    return json.dumps(_normal(value))


def _normal(value: Any) -> Any:
    """Sequences as lists (JSON's); numbers compare as numbers (3 == 3.0)."""
    if isinstance(value, tuple | list):
        return [_normal(item) for item in value]
    return value


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_shown(item) for item in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def shared(values: Mapping[str, tuple[str, Any]], service: str) -> list[Shared]:
    """`Shared` settings of `service` from {setting: (flag, value)}."""
    return [Shared(f"{service}.{name}", flag, value) for name, (flag, value) in values.items()]
