"""--config reads regular files only, of a bounded size and nesting: one line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynlab.cli import main


def _refused(capsys, config, words, out=None):
    out = out or Path(str(config)).parent / "out"
    assert main(["study", "length-generalization", "--preset", "smoke", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_fifo_is_refused_without_waiting(tmp_path, capsys):
    fifo = tmp_path / "cfg.toml"
    os.mkfifo(fifo)
    _refused(capsys, fifo, "not a regular file")


def test_a_device_and_a_folder_are_refused(tmp_path, capsys):
    _refused(capsys, "/dev/urandom", "not a regular file", tmp_path / "out")
    _refused(capsys, tmp_path, "not a regular file")


def test_a_large_file_is_refused(tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 200_000)
    _refused(capsys, big, "bytes; allowed: a UTF-8 TOML file of at most 1024 KiB")


@pytest.mark.parametrize("depth", [12, 5000])
def test_deep_nesting_is_refused(tmp_path, capsys, depth):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * depth + "]" * depth + "\n")
    _refused(capsys, deep, "nests tables or arrays deeper than 8")


def test_deep_dotted_headers_are_refused(tmp_path, capsys):
    """Dotted headers nest without the TOML parser recursing: still one line, exit 2."""
    deep = tmp_path / "dotted.toml"
    deep.write_text("[" + ".".join(["a"] * 3000) + "]\nx = 1\n")
    _refused(capsys, deep, "nests tables or arrays deeper than 8")
