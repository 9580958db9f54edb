"""The default data set is downloaded when missing; offline, the error says what to do."""
import urllib.request

import pytest

import data
from data import DataError


def test_offline_download_names_the_data_flag(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(data, "DEFAULT_DATA", str(tmp_path / "data" / "tinyshakespeare.txt"))
    with pytest.raises(DataError, match="--data"):
        data.read_text(None)


def test_a_download_of_the_wrong_size_is_refused(tmp_path, monkeypatch):
    class Truncated:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b"First Citizen:\n"

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Truncated())
    target = tmp_path / "data" / "tinyshakespeare.txt"
    monkeypatch.setattr(data, "DEFAULT_DATA", str(target))
    with pytest.raises(DataError, match="1115394"):
        data.read_text(None)
    assert not target.exists()


def test_split_is_90_10_by_characters():
    train, val = data.split_text("x" * 1000)
    assert len(train) == 900 and len(val) == 100
