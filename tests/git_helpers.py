"""Throwaway git repositories, for the tests of plan registration."""

import subprocess


def git(repo, *args) -> str:
  """`git -C repo *args`'s output, stripped; raises if git fails."""
  return subprocess.run(
      ["git", "-C", str(repo), *args],
      check=True,
      capture_output=True,
      text=True,
  ).stdout.strip()


def init(repo) -> None:
  """Makes `repo` (a pathlib.Path) an empty repository with an author."""
  repo.mkdir()
  git(repo, "init", "-q")
  git(repo, "config", "user.email", "t@t")
  git(repo, "config", "user.name", "t")
