"""Integrity manifests of checkpoint step directories.

`write_manifest` records the size and sha256 of every file of a step in
`<step>/integrity.json`, once every process has written and before the
rename; `find_damage` says how the files differ from it. A step directory
without a manifest is incomplete. Design: docs/design/checkpoints.md.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
from typing import Optional

from etils import epath

MANIFEST = "integrity.json"
# Step-level files orbax writes after the manifest: the commit time and marker.
WRITTEN_AFTER_MANIFEST = ("_CHECKPOINT_METADATA", "commit_success.txt")
_SHOWN_FAULTS = 3


def _covered_files(step_dir: epath.Path) -> dict[str, epath.Path]:
  """Every file of a step directory the manifest covers, by relative name."""
  files = {}
  for root, _, names in step_dir.walk():
    for name in names:
      rel = (root / name).relative_to(step_dir).as_posix()
      if rel != MANIFEST and rel not in WRITTEN_AFTER_MANIFEST:
        files[rel] = root / name
  return files


def _sha256(path: epath.Path) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(1 << 22):
      digest.update(chunk)
  return digest.hexdigest()


def _digests(paths: list[epath.Path]) -> list[str]:
  # hashlib releases the GIL: threads overlap reading and hashing across files.
  with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    return list(pool.map(_sha256, paths))


def write_manifest(step_dir: epath.Path) -> None:
  """Records the size and sha256 of every covered file of `step_dir`."""
  files = _covered_files(step_dir)
  names = sorted(files)
  record = {
      name: {"bytes": files[name].stat().length, "sha256": digest}
      for name, digest in zip(names, _digests([files[n] for n in names]))
  }
  (step_dir / MANIFEST).write_text(json.dumps({"files": record}, indent=1))


def find_damage(step_dir: epath.Path) -> Optional[str]:
  """Why `step_dir` differs from what its save wrote; None when it does not."""
  manifest = step_dir / MANIFEST
  if not manifest.exists():
    return (
        f"it has no {MANIFEST}: its save did not finish, or it was written before "
        "checkpoints carried integrity manifests"
    )
  try:
    saved = {
        name: (int(r["bytes"]), str(r["sha256"]))
        for name, r in json.loads(manifest.read_text())["files"].items()
    }
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return f"its {MANIFEST} is unreadable ({type(e).__name__}: {e})"
  files = _covered_files(step_dir)
  faults = [f"{name} is missing" for name in sorted(set(saved) - set(files))]
  faults += [
      f"{name} was not written by the save"
      for name in sorted(set(files) - set(saved))
  ]
  same_size = []
  for name in sorted(set(saved) & set(files)):
    size = files[name].stat().length
    if size == saved[name][0]:
      same_size.append(name)
    else:
      faults.append(
          f"{name} holds {size} bytes where {saved[name][0]} were saved"
      )
  for name, digest in zip(same_size, _digests([files[n] for n in same_size])):
    if digest != saved[name][1]:
      faults.append(f"{name} differs from the bytes saved (sha256 mismatch)")
  if not faults:
    return None
  more = len(faults) - _SHOWN_FAULTS
  return "; ".join(faults[:_SHOWN_FAULTS]) + (
      f"; and {more} more faults" if more > 0 else ""
  )
