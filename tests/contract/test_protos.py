"""Stubs are generated from the protos with the pinned tools; the protos pass buf STANDARD + COMMENTS."""

import shutil
import subprocess

from mascot.core.protogen import DEFAULT_OUT, generate
from tests.helpers.paths import ROOT, need


def test_regenerated_stubs_match_checked_in(tmp_path):
    files = generate(tmp_path)
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    # *_pb2.py, *_pb2.pyi, *_pb2_grpc.py each, and the descriptor set reflection serves
    assert len(protos) == 8 and len(files) == 3 * len(protos) + 1
    for rel in files:
        assert (tmp_path / rel).read_bytes() == (DEFAULT_OUT / rel).read_bytes(), f"{rel} is stale: run make protos"


def test_buf_lint_standard_and_comments():
    need(shutil.which("npx") is not None, "npx (Node.js) is needed to run buf from npm")
    version = next(ln.split("?=")[1].strip() for ln in (ROOT / "Makefile").read_text().splitlines()
                   if ln.startswith("BUF_VERSION"))
    out = subprocess.run(["npx", "--yes", f"@bufbuild/buf@{version}", "lint"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    need("could not determine executable" not in out.stderr and "ENOTFOUND" not in out.stderr,
         f"buf could not be fetched from npm: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stdout + out.stderr
