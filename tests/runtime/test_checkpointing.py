from datetime import timedelta

import pytest

import snapcut
from snapcut import Checkpointing, ConfigError


def test_defaults_are_flinks() -> None:
    c = Checkpointing()
    assert c.protocol == "aligned"
    assert c.interval is None
    assert c.timeout == 600.0
    assert (c.min_pause, c.max_concurrent, c.tolerable_failures, c.retained) == (0.0, 1, 0, 1)
    assert c.alignment_timeout == 0.0
    assert c.enabled


def test_protocol_names_are_canonicalised_in_rust() -> None:
    assert Checkpointing(protocol="Chandy_Lamport").protocol == "chandy-lamport"
    assert not Checkpointing(protocol="none").enabled
    for name in ("aligned", "unaligned", "chandy-lamport", "sync", "none"):
        assert Checkpointing(protocol=name).protocol == name


def test_timedelta_and_seconds_are_both_accepted() -> None:
    c = Checkpointing(interval=timedelta(milliseconds=250), timeout=timedelta(minutes=1))
    assert c.interval == timedelta(milliseconds=250)
    assert Checkpointing(protocol="unaligned", alignment_timeout=0.5).alignment_timeout == 0.5


def test_it_is_frozen() -> None:
    c = Checkpointing()
    with pytest.raises(AttributeError):
        c.protocol = "sync"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": -1}, "interval must be a finite, non-negative"),
        ({"interval": timedelta(seconds=-2)}, "interval must be a finite, non-negative"),
        ({"interval": 0}, "interval must be positive"),
        ({"interval": float("nan")}, "interval must be a finite"),
        ({"interval": "1s"}, "interval must be seconds"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"timeout": None}, "timeout must be seconds"),
        ({"min_pause": -0.5}, "min_pause must be a finite, non-negative"),
        ({"protocol": "bogus"}, 'unknown protocol "bogus"; use one of: aligned'),
        ({"protocol": 3}, "protocol must be a string"),
        ({"protocol": "unaligned", "max_concurrent": 2}, "max_concurrent_checkpoints = 1"),
        ({"alignment_timeout": 1.0}, "alignment_timeout only applies to protocol 'unaligned'"),
        ({"max_concurrent": 0}, "max_concurrent_checkpoints must be at least 1"),
        ({"max_concurrent": 1.5}, "max_concurrent must be an int"),
        ({"max_concurrent": True}, "max_concurrent must be an int"),
        ({"retained": 0}, "retained checkpoints must be at least 1"),
        ({"tolerable_failures": -1}, "tolerable_failures must not be negative"),
        ({"final_checkpoint": "yes"}, "final_checkpoint must be a bool"),
        ({"compaction_cpu_share": 0}, r"compaction_cpu_share must be in \[0.01, 1\]"),
        ({"compaction_cpu_share": 1.5}, r"compaction_cpu_share must be in \[0.01, 1\]"),
        ({"compaction_cpu_share": float("nan")}, r"compaction_cpu_share must be in \[0.01, 1\]"),
        ({"compaction_cpu_share": "half"}, "compaction_cpu_share must be a number"),
        ({"compaction_bytes_per_s": 0}, "compaction_bytes_per_s must be positive"),
        ({"compaction_bytes_per_s": -5}, "compaction_bytes_per_s must not be negative"),
        ({"compaction_bytes_per_s": 1.5}, "compaction_bytes_per_s must be an int"),
    ],
)
def test_bad_configuration_is_a_config_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Checkpointing(**kwargs)  # type: ignore[arg-type]


def test_config_error_is_a_snapcut_error() -> None:
    with pytest.raises(snapcut.SnapcutError):
        Checkpointing(protocol="nope")
