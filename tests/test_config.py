"""Settings: every HOROVODLITE_* variable, with Horovod's HOROVOD_* name as the fallback."""

import pytest

from horovodlite.config import Settings

# (variable without prefix, value, Settings field, expected) for every setting Horovod also has.
HOROVOD_SETTINGS = [
    ("CYCLE_TIME", "2.5", "cycle_time", 0.0025),
    ("FUSION_THRESHOLD", "1000", "fusion_threshold", 1000),
    ("STALL_CHECK_TIME_SECONDS", "7", "stall_check", 7.0),
    ("STALL_SHUTDOWN_TIME_SECONDS", "9", "stall_shutdown", 9.0),
    ("TIMELINE", "/tmp/t.json", "timeline", "/tmp/t.json"),
    ("TIMELINE_MARK_CYCLES", "1", "timeline_mark_cycles", True),
]
# Settings only horovodlite has: Horovod's prefix must not reach them.
OWN_SETTINGS = [
    ("CHECK_METADATA", "0", "check_metadata", False),
    ("ALLREDUCE_ALGORITHM", "naive", "allreduce_algorithm", "naive"),
    ("RING_SEGMENT_BYTES", "4096", "ring_segment_bytes", 4096),
    ("COLLECTIVE_TIMEOUT", "30", "collective_timeout", 30.0),
    ("OVERLAP", "0", "overlap", False),
]
ALL = HOROVOD_SETTINGS + OWN_SETTINGS


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name, *_ in ALL:
        monkeypatch.delenv("HOROVODLITE_" + name, raising=False)
        monkeypatch.delenv("HOROVOD_" + name, raising=False)


def test_defaults():
    assert Settings.from_environment() == Settings()
    assert Settings().fusion_threshold == 128 * 1024 * 1024 and Settings().cycle_time == 0.001


@pytest.mark.parametrize("name, value, field, expected", ALL)
def test_horovodlite_names(monkeypatch, name, value, field, expected):
    monkeypatch.setenv("HOROVODLITE_" + name, value)
    assert getattr(Settings.from_environment(), field) == expected


@pytest.mark.parametrize("name, value, field, expected", HOROVOD_SETTINGS)
def test_horovod_names_are_the_fallback(monkeypatch, name, value, field, expected):
    monkeypatch.setenv("HOROVOD_" + name, value)
    assert getattr(Settings.from_environment(), field) == expected
    # The HOROVODLITE_ name wins; an empty one counts as unset.
    monkeypatch.setenv("HOROVODLITE_" + name, "")
    assert getattr(Settings.from_environment(), field) == expected
    monkeypatch.setenv("HOROVODLITE_" + name, "0")
    assert getattr(Settings.from_environment(), field) != expected


@pytest.mark.parametrize("name, value, field, expected", OWN_SETTINGS)
def test_horovod_prefix_does_not_reach_own_settings(monkeypatch, name, value, field, expected):
    monkeypatch.setenv("HOROVOD_" + name, value)
    assert getattr(Settings.from_environment(), field) == getattr(Settings(), field)


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("HOROVODLITE_CYCLE_TIME", "fast", "HOROVODLITE_CYCLE_TIME='fast'"),
        ("HOROVOD_FUSION_THRESHOLD", "64MB", "HOROVOD_FUSION_THRESHOLD='64MB'"),
        ("HOROVODLITE_CHECK_METADATA", "maybe", "HOROVODLITE_CHECK_METADATA='maybe': expected"),
        ("HOROVODLITE_RING_SEGMENT_BYTES", "0", "RING_SEGMENT_BYTES must be positive"),
        ("HOROVODLITE_COLLECTIVE_TIMEOUT", "-1", "COLLECTIVE_TIMEOUT must be positive"),
        ("HOROVODLITE_ALLREDUCE_ALGORITHM", "tree", "HOROVODLITE_ALLREDUCE_ALGORITHM='tree'"),
    ],
)
def test_bad_values_name_the_variable(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=message):
        Settings.from_environment()


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().check_metadata = False
