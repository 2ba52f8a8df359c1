"""The package as a user gets it: ``python -m build`` makes an sdist and a
wheel (the wheel built from the sdist), the wheel installs into a fresh
venv (httpx from the registry), and examples/cron.py runs there against
the test lockd, importing the installed package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

from lockd import Lockd
from support import CLIENT_DIR, EXAMPLES, unique

# Installing from the registry can be slow; still bounded.
SLOW_S = 600


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=SLOW_S)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_build_install_into_a_fresh_venv_and_run_the_cron_example(
    tmp_path: Path, client: Lockd, url: str
) -> None:
    dist = tmp_path / "dist"
    # --no-isolation: the build backend (hatchling) is the pinned one of
    # requirements-dev.txt, in this venv.
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(CLIENT_DIR), cwd=tmp_path)
    (sdist,) = dist.glob("lockd_client-*.tar.gz")
    (wheel,) = dist.glob("lockd_client-*-py3-none-any.whl")
    assert sdist.name == "lockd_client-0.1.0.tar.gz"

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = Parser().parsestr(z.read("lockd_client-0.1.0.dist-info/METADATA").decode())
    assert {"lockd/__init__.py", "lockd/py.typed", "lockd/_core.py", "lockd/_sync.py", "lockd/_async.py"} <= set(names)
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    assert metadata["Name"] == "lockd-client" and metadata["Version"] == "0.1.0"
    assert metadata["Requires-Python"] == ">=3.9"
    assert metadata.get_all("Requires-Dist") == ["httpx<1,>=0.27"]
    assert metadata["License-Expression"] == "MIT OR Apache-2.0"
    assert "with client.lock" in metadata.get_payload(), "the README is the long description"

    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "src/lockd/__init__.py", "src/lockd/py.typed", "examples/cron.py"} <= members

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    python = str(venv / "bin" / "python")
    _run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel), cwd=tmp_path)

    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(EXAMPLES / "cron.py", app / "cron.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    where = _run(python, "-c", "import lockd; print(lockd.__file__, lockd.__version__)", cwd=app, env=env)
    assert where.startswith(str(venv)) and where.split()[1] == "0.1.0", where

    slot = unique("pkg").replace(":", "-")
    env.update(LOCKD_URL=url, CRON_SLOT=slot)
    out = _run(python, "cron.py", cwd=app, env=env)
    assert out.startswith("report written under fence "), out
    lease = client.acquire(f"cron:nightly-report:{slot}", ttl_ms=10_000)
    assert _run(python, "cron.py", cwd=app, env=env).startswith("another host runs it")
    client.release(lease)
