"""replace_folder replaces only what a command writes: the user's hidden entries (.git) stay,
a failure puts everything back, and a symbolic link keeps pointing at the new folder."""

from __future__ import annotations

import os

import pytest

from dynlab.results.files import replace_folder, staging_folder


def _folder(path, files):
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_the_users_hidden_entries_stay(tmp_path):
    out = _folder(tmp_path / "export", {".git/HEAD": "ref", ".gitattributes": "*", "config.json": "old", "old.bin": "x"})
    tmp = _folder(staging_folder(out), {".dynlab-export": "", "config.json": "new"})
    replace_folder(tmp, out)
    assert _tree(out) == [".dynlab-export", ".git/HEAD", ".gitattributes", "config.json"]
    assert (out / "config.json").read_text() == "new" and (out / ".git/HEAD").read_text() == "ref"
    assert sorted(os.listdir(tmp_path)) == ["export"]


def test_a_failed_swap_puts_everything_back(tmp_path, monkeypatch):
    out = _folder(tmp_path / "export", {".git/HEAD": "ref", "config.json": "old"})
    tmp = _folder(staging_folder(out), {"config.json": "new"})
    rename = os.rename

    def failing(src, dst):
        if str(src) == str(tmp):
            raise OSError(28, "No space left on device")
        return rename(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError):
        replace_folder(tmp, out)
    assert _tree(out) == [".git/HEAD", "config.json"] and (out / "config.json").read_text() == "old"
    assert _tree(tmp) == ["config.json"]  # the staging folder holds only what the command wrote


def test_a_symbolic_link_keeps_pointing_at_the_new_folder(tmp_path):
    target = _folder(tmp_path / "disk" / "export", {"config.json": "old"})
    link = tmp_path / "link"
    link.symlink_to(target)
    tmp = _folder(staging_folder(link), {"config.json": "new"})
    assert tmp.parent == target.parent  # staged beside the target: one file system
    replace_folder(tmp, link)
    assert link.is_symlink() and (link / "config.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path / "disk")) == ["export"]
